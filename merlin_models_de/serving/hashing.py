"""Hashing that depends on the value only, for training workflows and serving alike.

NVTabular 23.08 hashes on CPU with pandas' ``hash_pandas_object``, index included:
``HashBucket`` and ``Categorify(num_buckets=k)``'s out-of-vocabulary buckets give the same
value a different id in every row (``'u-1'`` three times: 805, 352, 191 mod 1000), so
training sees noise and a row scores differently alone than in a batch. The two operators
here replace them:

- :class:`ValueHashBucket` (instead of ``HashBucket``): ids ``2 + hash(value) % k``, nulls 1,
  0 left for padding (the layout of ``Categorify``);
- :class:`ValueCategorify` (instead of ``Categorify``): NVTabular's encoding, with its
  out-of-vocabulary buckets ``[2, 2 + num_buckets)`` computed from the value's hash. It also
  encodes a batch whose column is null in every row (the null id), which NVTabular's
  ``Categorify`` cannot (a one-row request with a null, or a ``JoinExternal`` row whose key
  the side table lacks).

:func:`value_hash` is a 64-bit BLAKE2b of the value's bytes: strings as UTF-8, integers and
booleans as 8-byte little-endian two's complement, floats as 8-byte IEEE 754 doubles, bytes as
they are. It does not depend on the row, the batch, the dtype's width or the library versions.

The module needs only NVTabular, NumPy and pandas, and ``workflow.save`` pickles it by value:
a saved workflow runs in Triton's executor without this package installed.

Example:
    >>> from merlin_models_de.serving.hashing import ValueCategorify, ValueHashBucket
    >>> category = ["category"] >> ValueCategorify(max_size=120, num_buckets=16)  # doctest: +SKIP
    >>> user = ["user_id"] >> ValueHashBucket(1000)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import struct
import sys

import cloudpickle
import numpy as np
import pandas as pd
from merlin.dag import ColumnSelector
from merlin.schema import Tags
from nvtabular.ops import Categorify, Operator

# workflow.save pickles the workflow for Triton: carry this code in the pickle
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NULL_ID = 1  # NVTabular 23.08's Categorify: 0 padding, 1 null, 2.. out of vocabulary
FIRST_BUCKET = 2
# the property both operators add to the columns they write, which the training commands
# read in the schema (apps/common/row_hashing.py): these ids hash the value only
VALUE_ONLY = "hashes_value_only"


def _value_bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value).to_bytes(8, "little", signed=True)
    if isinstance(value, (float, np.floating)):
        return struct.pack("<d", float(value))
    raise TypeError(f"Cannot hash {value!r} ({type(value).__name__}): strings, numbers, bytes")


def _hash_one(value) -> int:
    digest = hashlib.blake2b(_value_bytes(value), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def value_hash(values) -> np.ndarray:
    """uint64 hashes of ``values`` (a 1-d array or Series, nulls excluded: they get 0); each
    distinct value is hashed once."""
    codes, uniques = pd.factorize(pd.Series(np.asarray(values, dtype=object)))
    hashed = np.fromiter((_hash_one(v) for v in uniques), dtype=np.uint64, count=len(uniques))
    return np.where(codes >= 0, hashed[np.maximum(codes, 0)], np.uint64(0))


def bucket_ids(values, num_buckets: int) -> np.ndarray:
    """``2 + value_hash(values) % num_buckets`` as int64 (nulls: the null id 1)."""
    values = np.asarray(values, dtype=object)
    ids = (value_hash(values) % np.uint64(num_buckets)).astype(np.int64) + FIRST_BUCKET
    return np.where(pd.isna(values), NULL_ID, ids)


def _is_list(column) -> bool:
    present = column.dropna()
    return len(present) > 0 and isinstance(present.iloc[0], (list, tuple, np.ndarray))


def _per_row(column, fn):
    """``fn`` over a column's values: a scalar column's, or a list column's flattened leaves
    (rebuilt into the same lists)."""
    if not _is_list(column):
        return pd.Series(fn(column.to_numpy()), index=column.index)
    lists = [np.asarray(v if v is not None else [], dtype=object) for v in column]
    ends = np.cumsum([len(v) for v in lists])[:-1]
    leaves = np.concatenate(lists) if lists else np.asarray([], dtype=object)
    return pd.Series(list(np.split(fn(leaves), ends)), index=column.index)


class ValueHashBucket(Operator):
    """Hashes each value into ``num_buckets`` ids (an int, or ``{column: int}``):
    ``2 + value_hash(value) % num_buckets``, nulls the null id 1, 0 unused (padding), as
    ``Categorify`` lays ids out; the schema's domain is ``[0, num_buckets + 1]``."""

    # what the served workflow's check reads: a saved workflow carries these classes by value
    # (see above), so a loaded one's operators are not instances of this module's classes
    hashes_value_only = True

    def __init__(self, num_buckets):
        super().__init__()
        if not isinstance(num_buckets, (int, dict)) or isinstance(num_buckets, bool):
            raise TypeError(f"num_buckets: an int or {{column: int}}, received {num_buckets!r}")
        self.num_buckets = num_buckets

    def buckets_of(self, name: str) -> int:
        if isinstance(self.num_buckets, int):
            return self.num_buckets
        return self.num_buckets[name]

    def transform(self, col_selector: ColumnSelector, df):
        for name in col_selector.names:
            buckets = self.buckets_of(name)
            df[name] = _per_row(df[name], lambda v, k=buckets: bucket_ids(v, k))
        return df

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        schema = super().compute_output_schema(input_schema, col_selector, prev_output_schema)
        for name in schema.column_names:
            domain = {"min": 0, "max": self.buckets_of(name) + 1, "name": name}
            schema[name] = schema[name].with_properties({"domain": domain, VALUE_ONLY: True})
        return schema

    @property
    def output_tags(self):
        return [Tags.CATEGORICAL]

    @property
    def output_dtype(self):
        return np.int64


class ValueCategorify(Categorify):
    """NVTabular's ``Categorify`` (same arguments, same vocabulary and ids), except that its
    out-of-vocabulary buckets (``num_buckets``) hash the value only, and that a batch whose
    scalar column is null in every row is encoded as the null id instead of failing."""

    hashes_value_only = True  # as ValueHashBucket's

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        schema = super().compute_output_schema(input_schema, col_selector, prev_output_schema)
        return _marked(schema)

    def transform(self, col_selector: ColumnSelector, df):
        if col_selector.subgroups or not len(df):  # multi-column groups: NVTabular's as is
            return super().transform(col_selector, df)
        nulls = [n for n in col_selector.names if df[n].isna().all() and not _is_list(df[n])]
        rest = [n for n in col_selector.names if n not in nulls]
        out = super().transform(ColumnSelector(rest), df) if rest else df.copy(deep=False)
        for name in nulls:
            out[name] = np.full(len(df), NULL_ID, dtype=self.output_dtype)
        for name in rest:
            buckets = self._buckets_of(name)
            if buckets:
                out[name] = _rehash(df[name], out[name], buckets)
        return out

    def _buckets_of(self, name: str):
        if isinstance(self.num_buckets, dict):
            return self.num_buckets.get(name)
        return self.num_buckets


def _marked(schema):
    """``schema`` with :data:`VALUE_ONLY` on every column: the mark the training commands
    look for (NVTabular's hashing writes the same other properties)."""
    for name in schema.column_names:
        schema[name] = schema[name].with_properties({VALUE_ONLY: True})
    return schema


def _rehash(raw, encoded, buckets: int):
    """``encoded`` with its out-of-vocabulary ids (``[2, 2 + buckets)``) replaced by the
    value's bucket (scalar columns: NVTabular 23.08 cannot hash list columns on CPU)."""
    ids = np.asarray(encoded).copy()
    oov = (ids >= FIRST_BUCKET) & (ids < FIRST_BUCKET + buckets)
    ids[oov] = bucket_ids(raw.to_numpy()[oov], buckets)
    return pd.Series(ids, index=raw.index)


__all__ = ["ValueCategorify", "ValueHashBucket", "bucket_ids", "value_hash"]
