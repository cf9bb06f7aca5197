"""Initializers for one shard of a table, drawn from the distribution of the whole table.

A rank initializes only its shards, with the shard's shape. Initializers whose distribution
does not depend on the shape (``uniform``, ``RandomNormal``, ``TruncatedNormal``, constants)
give a shard exactly what the whole table would hold there in distribution. Fan-based ones
(``glorot_*``, ``he_*``, ``lecun_*``, any ``VarianceScaling``) compute their variance from the
shape, so a row- or column-sliced shard would start wider or narrower than ``mm.Embeddings``'
table; here their scale is corrected so the variance is the whole table's. Initializers that
draw the matrix as one object (``Orthogonal``, ``Identity``) cannot be drawn a piece at a time;
a table split across ranks with one of them is refused.
"""
from __future__ import annotations

import tensorflow as tf

WHOLE_MATRIX = ("Orthogonal", "Identity")  # class names: no shard can be drawn alone


def _fan(shape, mode: str) -> float:
    fan_in, fan_out = float(shape[0]), float(shape[1])
    fan = {"fan_in": fan_in, "fan_out": fan_out}.get(mode, (fan_in + fan_out) / 2.0)
    return max(1.0, fan)


def check_sliceable(plan, initializer) -> None:
    """Raises (on every rank: the plan is the same everywhere) if a table that the plan splits
    has an initializer that only draws whole matrices. ``initializer(table) -> Keras init``."""
    for table in plan.tables:
        split = [s for s in plan.shards_of(table.name) if (s.rows, s.cols) != (table.rows, table.dim)]
        name = type(initializer(table.name)).__name__
        if split and name in WHOLE_MATRIX:
            raise ValueError(
                f"Table {table.name!r} is split across ranks ({split[0].kind.value}, shard "
                f"{split[0].rows}x{split[0].cols} of {table.rows}x{table.dim}) but its "
                f"embeddings_initializer {name} draws the whole matrix at once, so no rank can "
                f"draw its shard alone. Use a shape-independent initializer (e.g. 'uniform', "
                f"TruncatedNormal) or a plan that keeps this table whole (table-wise).")


def for_shard(initializer, table_shape, shard_shape):
    """``initializer`` as it should be called with ``shard_shape`` to draw like the table.

    Unchanged when the shard is the whole table, or when the distribution does not depend on
    the shape. For ``VarianceScaling`` (Glorot, He, LeCun): a copy whose scale makes
    ``scale / fan(shard)`` equal the table's ``scale / fan(table)``.
    """
    if tuple(shard_shape) == tuple(table_shape):
        return initializer
    if not isinstance(initializer, tf.keras.initializers.VarianceScaling):
        return initializer
    mode = initializer.mode
    scale = initializer.scale * _fan(shard_shape, mode) / _fan(table_shape, mode)
    return tf.keras.initializers.VarianceScaling(scale=scale, mode=mode,
                                                 distribution=initializer.distribution,
                                                 seed=initializer.seed)
