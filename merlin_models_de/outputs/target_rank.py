"""Each target's rank among all items of a row-sharded catalog: the top-k metrics of a
vocab-parallel output at any cutoff.

One process ranks an example's items by ``tf.math.top_k`` of its full logits ``H @ W^T + b``
(equal scores: the lower item id first); Merlin's top-k metrics (recall, MRR, NDCG, MAP,
precision at k) of one target per example depend only on the target's 0-based position in
that order. With the table split by rows (module :mod:`.vocab_parallel`), that position is a
count over every rank's rows::

    H, y   = allgather(hidden), allgather(targets)                       [B, d], [B]
    t_i    = H_i . W[y_i] + b[y_i]    on the rank holding row y_i, summed over ranks
    c_r,i  = #{j in rank r's rows, j != y_i: z_ij > t_i, or z_ij == t_i and j < y_i}
    rank_i = sum_r c_r,i              (each example's counts summed on its own rank)

scored ``chunk_rows`` at a time, as the loss is: no rank holds the catalog's logits.
Not differentiable. Collective: every rank calls it, each with its own examples.
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.outputs.vocab_parallel import (
    DEFAULT_CHUNK_ROWS,
    _check_targets,
    _chunk_logits,
    _gather_inputs,
    _scan,
    _static_checks,
    _targets_of,
)


def _target_logits(hidden, targets, table, bias, offset):
    """``[B]`` logit of each example's target where this rank holds its row, else 0."""
    local = targets - offset
    rows = tf.shape(table, out_type=tf.int64)[0]
    owned = (local >= 0) & (local < rows)
    index = tf.where(owned, local, rows)  # a zero row appended: ranks with no rows gather too
    padded = tf.concat([table, tf.zeros([1, hidden.shape[-1]], table.dtype)], 0)
    logits = tf.reduce_sum(hidden * tf.gather(padded, index), axis=1)
    if bias is not None:
        logits += tf.gather(tf.concat([bias, tf.zeros([1], bias.dtype)], 0), index)
    return tf.where(owned, logits, tf.zeros_like(logits))


def sharded_target_rank(
    hidden,
    targets,
    table_rows,
    row_offset,
    num_rows,
    bias_rows=None,
    chunk_rows=DEFAULT_CHUNK_ROWS,
    name="mmde_vocab_rank",
):
    """``[B_local]`` int32: each target's 0-based position among all items, in the order
    ``tf.math.top_k`` gives one process's full logits (ties: the lower id first).

    Args: as :func:`~merlin_models_de.outputs.vocab_parallel.sharded_softmax_cross_entropy`
    (``name`` prefixes this call's collectives).
    """
    where = f"sharded_target_rank '{name}'"
    hidden = tf.stop_gradient(tf.convert_to_tensor(hidden))
    table = tf.stop_gradient(tf.convert_to_tensor(table_rows))
    bias = tf.stop_gradient(tf.convert_to_tensor(bias_rows)) if bias_rows is not None else None
    _static_checks(where, hidden, table, bias, chunk_rows)
    targets = _targets_of(where, targets)
    h, y, sizes, catalog, header = _gather_inputs(
        where, name, hidden, targets, table, bias, row_offset, num_rows
    )
    offset = tf.cast(row_offset, tf.int64)
    with tf.control_dependencies([_check_targets(where, y, header, catalog)]):
        mine = _target_logits(h, y, table, bias, offset)
    # one rank holds each target's row: the sum over ranks is its logit
    target = comm.allreduce(comm.after(mine, y), op="sum", name=f"{name}_target_logit")

    def body(_, lo, size, state):
        (count,) = state
        logits, _ = _chunk_logits(h, table, bias, lo, size)
        ids = offset + tf.cast(lo, tf.int64) + tf.range(size, dtype=tf.int64)
        higher = logits > target[:, None]
        tied_before = (logits == target[:, None]) & (ids[None, :] < y[:, None])
        ahead = (higher | tied_before) & (ids[None, :] != y[:, None])
        return (count + tf.reduce_sum(tf.cast(ahead, tf.int32), axis=1),)

    (count,) = _scan(table, chunk_rows, body, (tf.zeros(tf.shape(y), tf.int32),))
    # each asker's counts back to it (the all-to-all the loss's statistics take too)
    received, _ = comm.alltoall(comm.after(count, target), sizes, name=f"{name}_counts")
    return tf.reduce_sum(tf.reshape(received, [comm.size(), -1]), axis=0)


__all__ = ["sharded_target_rank"]
