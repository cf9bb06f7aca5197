"""Row statistics of column-sliced tables, made whole across the ranks holding the slices.

A row-wise optimizer needs, for each looked-up row, the sum of squares of the row's gradient
over the *whole* row. A table split by columns has each holder keep some columns of every
row, so each holder knows its columns' share only. One allgather per block and step brings
every rank's ``(table, row id, partial sum)`` to all ranks and each holder adds the partials
of its own rows. Every rank of the block issues it, holding a slice or not (then it sends
nothing): a collective issued on some ranks only would hang the others.

The column slices of one table serve the same lookups (every slice answers every id of the
table's features), so the holders see the same rows; the sums are matched by row id all
the same, never by position.
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.kernels.rounding import widened
from merlin_models_de.variables import column_sync, table_mark


class ColumnSums:
    """``{variable ref: (row ids, their summed gradient rows, whole-row sum of squares)}``
    of the column-sliced table variables of one ``apply_gradients``."""

    def __init__(self, found=None):
        self.found = dict(found or {})

    def of(self, var):
        """The entry of a column-sliced ``var``; an error naming its table when its block's
        collective did not run in this step (a :func:`column_sums` without the block's
        anchor: the optimizer does not train the whole block)."""
        if var.ref() not in self.found:
            raise ValueError(
                f"Row-wise optimizer state of the column-sliced table "
                f"'{table_mark(var).table}' needs its block's collective: a block of the "
                f"horovod backend whose variables this optimizer trains together (its "
                f"'exchange_anchor' was not among them). Received: variable={var.name!r}"
            )
        return self.found[var.ref()]


def column_sums(grads_and_vars) -> ColumnSums:
    """The whole-row sums of squares of every column-sliced table in ``grads_and_vars``,
    one allgather (ids, then sums) per block whose anchor is among the variables."""
    grads = {v.ref(): g for g, v in grads_and_vars}
    syncs = []  # (prefix, tables, owner) in variable order: the same on every rank
    for _, var in grads_and_vars:
        sync = column_sync(var)
        if sync is not None and sync[1] and sync not in syncs:
            syncs.append(sync)
    found, seen = {}, {}
    for prefix, tables, owner in sorted(syncs, key=lambda s: s[0]):  # stable: same order
        # two blocks of one name and tables share a prefix: the k-th gets its own names
        k = seen[prefix] = seen.get(prefix, -1) + 1
        name = f"{prefix}_rowwise{k or ''}"
        found.update(_block_sums(name, tables, owner, grads_and_vars, grads))
    return ColumnSums(found)


def _block_sums(name, tables, owner, grads_and_vars, grads) -> dict:
    mine = {}  # table index -> (var, ids, summed rows)
    by_table = {
        table_mark(v).table: v
        for _, v in grads_and_vars
        if table_mark(v) is not None
        and table_mark(v).column_sliced
        and table_mark(v).owner == owner
    }
    n = len(tables)
    for t, table in enumerate(tables):
        var = by_table.get(table)
        if var is not None and grads.get(var.ref()) is not None:
            ids, rows = unique_rows(grads[var.ref()], var)
            mine[t] = (var, ids, rows)
    keys = [ids * n + t for t, (_, ids, _) in mine.items()]  # one key space for all tables
    sums = [tf.reduce_sum(tf.square(rows), axis=1) for _, _, rows in mine.values()]
    all_keys = comm.allgather(_concat(keys, tf.int64), name=f"{name}_ids")
    all_sums = comm.allgather(_concat(sums, tf.float32), name=f"{name}_sums")
    out = {}
    for t, (var, ids, rows) in mine.items():
        own = ids * n + t
        # own keys first: tf.unique keeps first occurrences in order, so they index 0..k-1
        unique, index = tf.unique(tf.concat([own, all_keys], 0))
        values = tf.concat([tf.zeros_like(own, tf.float32), all_sums], 0)
        total = tf.math.unsorted_segment_sum(values, index, tf.size(unique))
        out[var.ref()] = (ids, rows, tf.cast(total[: tf.size(own)], rows.dtype))
    return out


def unique_rows(grad, var):
    """``(unique int64 row ids, summed gradient rows)`` of a sparse or dense gradient (rows
    of a 16-bit table summed in float32)."""
    if isinstance(grad, tf.IndexedSlices):
        ids, index = tf.unique(tf.cast(grad.indices, tf.int64))
        rows = tf.math.unsorted_segment_sum(widened(grad.values), index, tf.size(ids))
        return ids, rows
    return tf.range(tf.shape(var, out_type=tf.int64)[0]), widened(tf.convert_to_tensor(grad))


def _concat(parts, dtype):
    return tf.concat([tf.cast(p, dtype) for p in parts], 0) if parts else tf.zeros([0], dtype)
