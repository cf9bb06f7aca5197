"""Per-table options and regularization losses that equal one process on N ranks.

``mm.Embeddings`` takes ``embeddings_regularizer``, ``l2_batch_regularization_factor`` and
``trainable`` as one value or as a dict by feature name; a table takes the value of its first
feature (the column it was created from). Here a table name works as a key too.

Why the factors below give one process's loss and updates (N ranks, batch B each, against
one process with batch N·B; Horovod averages the dense gradients over ranks, and sharded
tables' gradients are divided by N, see :mod:`merlin_models_de.merlin.hooks`):

- the main loss is a mean over the batch: the mean over N·B is the average of the per-rank
  means, so Horovod's averaging gives one process;
- the batch L2 term ``factor * sum(out ** 2)`` is a sum over the batch: the global sum is N
  times the average of the per-rank sums, so each rank adds N times its own sum;
- ``reg(table)`` of an additive regularizer (L1, L2, L1L2: a sum over the elements) is the
  sum over the table's shards; a rank adds N times ``reg`` of each shard it holds, whose
  gradient, divided by N, is one process's; a replicated (data-parallel) table is whole on
  every rank, so each rank adds ``reg(table)`` and averaging keeps it.

Example:
    >>> table_option({"user": 0.1}, table, 0.0)  # doctest: +SKIP
    0.1
"""

from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from merlin_models_de.kernels.rounding import read_wide
from merlin_models_de.planner.types import ShardingType

ADDITIVE = (tf.keras.regularizers.L1, tf.keras.regularizers.L2, tf.keras.regularizers.L1L2)


def is_by_name(value) -> bool:
    """A dict by feature / table name (not a serialized Keras object's config)."""
    # (Keras wraps dict attributes in trackable wrappers, which are not Mapping instances)
    is_dict = isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "get"))
    return is_dict and "class_name" not in value


def table_option(value, table, default=None):
    """``value`` for ``table``: one value for all, or a dict read at the table's first feature
    (as ``mm.Embeddings``) or at the table's name; ``default`` when the dict names neither."""
    if not is_by_name(value):
        return default if value is None else value
    first = table.features[0].name
    if first in value:
        return value[first]
    return value.get(table.name, default)


def check_keys(option: str, value, tables) -> None:
    """A dict naming something that is neither a feature nor a table raises, naming it."""
    if not is_by_name(value):
        return
    known = {t.name for t in tables} | {f.name for t in tables for f in t.features}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(
            f"{option} names features or tables that are not in the schema: "
            f"{unknown}. Known: {sorted(known)}"
        )


def regularizers(value, tables) -> dict:
    """``{table: Keras regularizer}`` for the tables that have one."""
    out = {}
    for t in tables:
        reg = tf.keras.regularizers.get(table_option(value, t))
        if reg is not None:
            out[t.name] = reg
    return out


def check_regularizers(regs: Mapping, plan) -> None:
    """On N ranks a sharded table takes only an additive regularizer (see module docstring)."""
    if plan.world_size == 1:
        return
    for name, reg in regs.items():
        sharded = plan.shards_of(name)[0].kind is not ShardingType.DATA_PARALLEL
        if sharded and type(reg) not in ADDITIVE:
            raise ValueError(
                f"embeddings_regularizer for table '{name}' must be L1, L2 or L1L2 on "
                f"{plan.world_size} ranks: the table is sharded, and only a sum over its "
                f"elements can be computed shard by shard. Replicate the table "
                f"(data_parallel_threshold) or use one process. Received: "
                f"embeddings_regularizer={reg!r}"
            )


def shard_loss_weight(shard, world_size: int) -> int:
    """N for a shard of a sharded table, 1 for a replicated table (see module docstring)."""
    return 1 if shard.kind is ShardingType.DATA_PARALLEL else world_size


def add_table_losses(layer, backend, plan, rank: int, regs: Mapping) -> None:
    """Adds ``weight * reg(shard)`` for every shard on this rank whose table has a regularizer."""
    for shard in plan.shards_on(rank):
        reg = regs.get(shard.table)
        if reg is None:
            continue
        var, first = backend.shard_variable(shard)
        weight = shard_loss_weight(shard, plan.world_size)

        def loss(var=var, first=first, rows=shard.rows, reg=reg, weight=weight):
            whole = first == 0 and var.shape[0] == rows
            values = var if whole else var[first : first + rows]
            value = reg(values if values.dtype.size > 2 else read_wide(values, tf.float32))
            return value * weight if weight != 1 else value

        layer.add_loss(loss)


def batch_l2_factors(value, tables) -> dict:
    """``{table: factor}`` of ``l2_batch_regularization_factor`` for the tables with one > 0."""
    out = {}
    for t in tables:
        factor = table_option(value, t, 0.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 0:
            raise ValueError(
                f"l2_batch_regularization_factor for table '{t.name}' must be a "
                f"number >= 0. Received: {factor!r}"
            )
        if factor > 0:
            out[t.name] = float(factor)
    return out


def batch_l2_loss(output, factor: float, world_size: int):
    """``N * factor * sum(output ** 2)`` over this rank's batch (ragged outputs too)."""
    return (world_size * factor) * tf.reduce_sum(tf.square(output))


def trainable_tables(value, tables) -> dict[str, bool]:
    """``{table: bool}`` from ``trainable`` (one bool, or a dict by feature / table name)."""
    out: dict[str, Any] = {}
    for t in tables:
        flag = table_option(value, t, True)
        if not isinstance(flag, bool):
            raise ValueError(f"trainable for table '{t.name}' must be a bool. Received: {flag!r}")
        out[t.name] = flag
    return out
