"""A request checked against the workflow's input schema before the ensemble runs.

Merlin's executor and NVTabular's operators fail deep inside on a bad request (a missing
column: a bare ``KeyError``; no rows or a null list: ``Failed to categorical encode``), and
encode an id column of the wrong type (ints where the workflow was fitted on strings) as
out-of-vocabulary ids without a word. :func:`check_request` names the column, the type the
workflow reads and the type received; :class:`CheckedEnsemble` runs it first on every
``transform``, in this process and in Triton's executor, then serves a null list as an empty
one (:func:`empty_lists_for_nulls`).

Like :mod:`.model_inputs`, this module needs only Merlin, NumPy and pandas: it is pickled by
value into the Triton model repository, which then runs without this package installed.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
from merlin.schema import Schema
from merlin.systems.dag import Ensemble

# Ensemble.export pickles the ensemble for Triton's executor: carry this code in the pickle
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Merlin's element types as the kinds a request's values are compared by
_KINDS = {
    "object": "string",
    "string": "string",
    "int": "integer",
    "uint": "integer",
    "float": "float",
    "bool": "bool",
}
# kinds accepted where another is expected (an integer is exact as a float)
_ACCEPTED = {"float": {"float", "integer"}}


class RequestError(ValueError):
    """A request the ensemble cannot serve; the message names the column and the types."""


def check_request(request, schema: Schema) -> None:
    """Raises :class:`RequestError` unless ``request`` (a DataFrame or a TensorTable) has
    every column of ``schema`` (the workflow's input schema), at least one row, and values
    of each column's kind (strings, integers, floats; integers where floats are read) and
    shape (scalar or list). A column whose values are all null or all empty lists carries
    no type and passes (the workflow gives nulls the null id)."""
    columns = _columns(request)
    missing = [c.name for c in schema if c.name not in columns]
    if missing:
        wanted = ", ".join(f"{name} ({_expected(schema[name])})" for name in missing)
        raise RequestError(
            f"Request is missing columns the workflow reads: {wanted}. "
            f"Received columns: {sorted(columns)}"
        )
    if all(_rows(columns[c.name]) == 0 for c in schema):
        raise RequestError(
            f"Request has no rows (columns {schema.column_names}): send at least one row"
        )
    for col in schema:
        is_list, kind, label = _received(columns[col.name])
        expected = _KINDS.get(col.dtype.element_type.value)
        shape_differs = is_list is not None and is_list != col.is_list
        kind_differs = (
            kind is not None
            and expected is not None
            and kind not in _ACCEPTED.get(expected, {expected})
        )
        if shape_differs or kind_differs:
            raise RequestError(
                f"Request column {col.name!r}: expected {_expected(col)}, received {label}"
            )


def _expected(col) -> str:
    kind = _KINDS.get(col.dtype.element_type.value, col.dtype.name)
    what = f"{kind} ({col.dtype.name})"
    return f"lists of {what}" if col.is_list else what


def _columns(request) -> dict:
    """``{name: column}``: a DataFrame's Series, a TensorTable's arrays (``(values,
    offsets)`` for a list column)."""
    if hasattr(request, "to_dict") and hasattr(request, "column_type"):  # a TensorTable
        return {
            name: (col.values, col.offsets) if col.offsets is not None else col.values
            for name, col in request.items()
        }
    return {name: request[name] for name in request.columns}


def _rows(column) -> int:
    return len(column[1]) - 1 if isinstance(column, tuple) else len(column)


def _received(column) -> tuple:
    """``(is a list, kind, label)`` of one request column; ``None`` where its values do not
    tell (all null, all empty lists)."""
    if isinstance(column, tuple):  # a TensorTable's list column
        values = np.asarray(column[0])
        kind = _kind(values)
        return True, kind, f"lists of {kind or 'unknown'} ({values.dtype})"
    values = np.asarray(getattr(column, "to_numpy", lambda: column)())
    if values.dtype != object:
        is_list = values.ndim > 1 and values.shape[-1] != 1  # Triton sends [rows, 1] scalars
        kind = _kind(values)
        label = f"{kind or 'nulls'} ({values.dtype})"
        return is_list, kind, f"lists of {label}" if is_list else label
    present = [v for v in values if not _is_null(v)]
    if not present:
        return None, None, "nulls"
    if isinstance(present[0], (list, tuple, np.ndarray)):
        items = np.asarray([x for v in present for x in v], dtype=object)
        kind = _kind(items)
        return True, kind, f"lists of {kind or 'nothing'}"
    kind = _kind(np.asarray(present, dtype=object))
    return False, kind, f"{kind} (object)"


def _kind(values: np.ndarray):
    """The kind of an array's values: by dtype, or by the first present value of an object
    array; None when nothing is present."""
    by_dtype = {
        "i": "integer",
        "u": "integer",
        "f": "float",
        "b": "bool",
        "U": "string",
        "S": "string",
        "M": "datetime",
    }
    if values.dtype.kind == "f" and np.isnan(values).all():
        return None  # all null
    if values.dtype.kind in by_dtype:
        return by_dtype[values.dtype.kind]
    for value in values.reshape(-1):
        if _is_null(value):
            continue
        if isinstance(value, (str, bytes)):
            return "string"
        if isinstance(value, (bool, np.bool_)):
            return "bool"
        if isinstance(value, (int, np.integer)):
            return "integer"
        if isinstance(value, (float, np.floating)):
            return "float"
        return type(value).__name__
    return None


def _is_null(value) -> bool:
    import pandas as pd

    return pd.api.types.is_scalar(value) and bool(pd.isna(value))


def empty_lists_for_nulls(frame, columns):
    """``frame`` (a pandas DataFrame) with a null row of each list column in ``columns`` as
    an empty list, and a fresh index (NVTabular 23.08 encodes a list column of a frame whose
    index does not start at 0 as nulls). NVTabular fails on a null list (``Failed to
    categorical encode``; fitting on CPU, ``unhashable type`` when the first row is null):
    call it on the rows a workflow fits on and transforms, as the ensemble does on every
    request. Other inputs (a TensorTable, which has no null list) are returned as they are."""
    if not hasattr(frame, "columns") or not hasattr(frame, "reset_index"):
        return frame
    frame = frame.reset_index(drop=True)
    for name in columns:
        if name in frame.columns and frame[name].dtype == object:
            nulls = frame[name].map(_is_null)
            if nulls.any():
                frame = frame.assign(**{name: [[] if n else v for n, v in zip(nulls, frame[name])]})
    return frame


class CheckedEnsemble(Ensemble):
    """A Merlin Systems ``Ensemble`` that checks each request against its input schema
    (:func:`check_request`) before it runs the graph, and serves a null in a list column as
    an empty list (:func:`empty_lists_for_nulls`)."""

    def transform(self, transformable, runtime=None):
        check_request(transformable, self.input_schema)
        lists = [c.name for c in self.input_schema if c.is_list]
        return super().transform(empty_lists_for_nulls(transformable, lists), runtime=runtime)


__all__ = ["CheckedEnsemble", "RequestError", "check_request", "empty_lists_for_nulls"]
