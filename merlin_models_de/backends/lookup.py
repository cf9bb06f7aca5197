"""Local lookup math shared by the backends: ids in, pooled vectors out (TensorFlow).

Every lookup is a gather from a local variable. Multi-hot lookups pool with a weighted
segment sum, the weight of each id being 1 (sum), 1/n (mean) or 1/sqrt(n) (sqrtn) where n is
the sample's total number of ids; that is what TF's ``embedding_lookup_sparse`` computes, and
it stays right when a row-sliced table pools only part of a sample's ids on each rank.

Example:
    >>> pooled_lookup(var, ids, row_lengths=lengths, combiner="mean")  # doctest: +SKIP
"""

from __future__ import annotations

import re

import tensorflow as tf

from merlin_models_de.kernels.rounding import read_wide


def op_name(text: str) -> str:
    """``text`` as a valid TF op name (feature and table names may hold any character)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def combiner_weights(row_lengths, combiner: str):
    """Per-id weights ``[nnz]`` for ``combiner`` given each sample's id count."""
    n = tf.cast(row_lengths, tf.float32)
    if combiner == "sum":
        per_row = tf.ones_like(n)
    elif combiner == "mean":
        per_row = tf.math.divide_no_nan(1.0, n)
    elif combiner == "sqrtn":
        per_row = tf.math.divide_no_nan(1.0, tf.sqrt(n))
    else:
        raise ValueError(
            f"Unknown combiner; expected sum, mean or sqrtn. Received: combiner={combiner!r}"
        )
    return tf.repeat(per_row, row_lengths)


def named_gather(var, ids, name, dtype=None):
    """``tf.gather(var, ids)`` whose out-of-range error (CPU, ids unvalidated) says ``name``:
    graph mode names the failing node; eager errors carry no op name, so add it here.
    ``dtype``: the rows widened to it (a 16-bit table's rows are read into the block's dtype;
    their gradient reaches the table in that dtype: ``rounding.read_wide``)."""
    rows = _gather(var, ids, name)
    return rows if dtype is None else read_wide(rows, dtype)


def _gather(var, ids, name):
    if name is None or not tf.executing_eagerly():
        return tf.gather(var, ids, name=name)
    try:
        return tf.gather(var, ids, name=name)
    except tf.errors.InvalidArgumentError as err:
        raise tf.errors.InvalidArgumentError(
            err.node_def, err.op, f"{err.message} [{name}]"
        ) from None


def pooled_lookup(
    var, ids, *, row_lengths=None, combiner=None, row_range=None, name=None, dtype=None
):
    """Looks ``ids`` up in ``var``, pooling multi-hot samples.

    Args:
        var: The local variable (one shard or table).
        ids: int ids ``[n]`` (one-hot) or the flat values ``[nnz]`` of a multi-hot batch.
        row_lengths: ``[n]`` ids per sample for multi-hot inputs; None for one-hot.
        combiner: ``sum`` / ``mean`` / ``sqrtn`` for multi-hot inputs.
        row_range: ``(start, rows)`` for a row-sliced shard: ids outside it contribute zero.
        name: Name of the gather op (it appears in TF's error for an id outside ``var``).
        dtype: The dtype rows are read into and pooled in (None: ``var``'s).

    Returns:
        ``[n, cols]`` vectors in ``dtype``.
    """
    ids = tf.cast(ids, tf.int64)
    mask = None
    if row_range is not None:
        start, rows = row_range
        local = ids - start
        inside = tf.logical_and(local >= 0, local < rows)
        ids = tf.where(inside, local, tf.zeros_like(local))
        mask = inside
    vectors = named_gather(var, ids, name, dtype)
    if mask is not None:
        mask = tf.cast(mask, vectors.dtype)
    if row_lengths is None:
        return vectors if mask is None else vectors * mask[:, None]
    return pooled(vectors, row_lengths, combiner, mask)


def pooled(vectors, row_lengths, combiner: str, mask=None):
    """``[samples, cols]``: each sample's ``vectors`` (one per id, in order) weighted by
    ``combiner`` (and ``mask``, ids that count: 1, others 0) and summed."""
    row_lengths = tf.cast(row_lengths, tf.int64)
    weights = tf.cast(combiner_weights(row_lengths, combiner), vectors.dtype)
    if mask is not None:
        weights = weights * mask
    n = tf.shape(row_lengths, out_type=tf.int64)[0]
    segments = tf.repeat(tf.range(n), row_lengths)
    return tf.math.unsorted_segment_sum(vectors * weights[:, None], segments, n)


def to_ids(value, feature: str, multi_hot: bool):
    """Normalizes one input to ``(ids, row_lengths)``; ``row_lengths`` is None for one-hot.

    Accepts dense ``[B]`` / ``[B, 1]``, dense ``[B, k]`` (multi-hot, k ids each), ragged
    ``[B, None]`` / ``[B, None, 1]`` and sparse ``[B, k]`` tensors.
    """
    if isinstance(value, tf.SparseTensor):
        value = tf.RaggedTensor.from_sparse(value)
    dtype = value.dtype if hasattr(value, "dtype") else tf.convert_to_tensor(value).dtype
    if not dtype.is_integer:
        raise ValueError(f"Feature '{feature}' must hold integer ids. Received: dtype={dtype.name}")
    if isinstance(value, tf.RaggedTensor):
        if value.shape.rank == 3:
            value = value.merge_dims(1, 2)
        if not multi_hot:
            raise ValueError(
                f"Feature '{feature}' is one-hot in the schema but its input is "
                f"ragged. Received: {value!r}"
            )
        return tf.cast(value.values, tf.int64), tf.cast(value.row_lengths(), tf.int64)
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 3 and value.shape[-1] == 1:  # fixed-length lists as [B, k, 1]
        value = tf.squeeze(value, axis=-1)
    if value.shape.rank == 2 and value.shape[-1] == 1 and not multi_hot:
        value = tf.squeeze(value, axis=-1)
    if value.shape.rank == 0 or value.shape.rank > 2:
        raise ValueError(
            f"Feature '{feature}' must be [batch] or [batch, k] ids. "
            f"Received: shape={value.shape}"
        )
    if multi_hot:
        if value.shape.rank == 1:
            value = value[:, None]
        k = tf.shape(value, out_type=tf.int64)[1]
        lengths = tf.fill(tf.shape(value, out_type=tf.int64)[:1], k)
        return tf.reshape(tf.cast(value, tf.int64), [-1]), lengths
    if value.shape.rank == 2:
        raise ValueError(
            f"Feature '{feature}' is one-hot in the schema but its input has "
            f"{value.shape[-1]} ids per sample. Received: shape={value.shape}"
        )
    return tf.cast(value, tf.int64), None


def sequence_output(rows, value, dim: int):
    """Un-pooled rows ``[ids, dim]`` (in flat-id order) shaped like the input ``value``:
    ragged input -> ragged ``[B, None, dim]`` with the input's row splits; dense ``[B, k]`` /
    ``[B, k, 1]`` -> dense ``[B, k, dim]`` (what ``mm.Embeddings`` returns)."""
    if isinstance(value, tf.SparseTensor):
        value = tf.RaggedTensor.from_sparse(value)
    if isinstance(value, tf.RaggedTensor):
        if value.shape.rank == 3:
            value = value.merge_dims(1, 2)
        return tf.RaggedTensor.from_row_splits(rows, value.row_splits, validate=False)
    value = tf.convert_to_tensor(value)
    k = value.shape[1] if value.shape.rank and value.shape.rank > 1 else 1
    shape = tf.concat([tf.shape(value)[:1], [k if k is not None else -1, dim]], 0)
    out = tf.reshape(rows, shape)
    out.set_shape([value.shape[0], k, dim])
    return out
