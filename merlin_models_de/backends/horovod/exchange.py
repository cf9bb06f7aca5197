"""One exchange for rows that live on other ranks: queries to every rank, answers back.

Lookups in which any rank may need rows of any owner run here: a row-sliced table's in the
block's step (:mod:`.pipeline`), a dynamic table's (:mod:`.dynamic_exchange`) and the table
handles' lookups of arbitrary ids in row-, table- or column-sliced tables (:mod:`.table_lookup`).
(In the block's step the ids of table and column slices go to their owners only, in the
step's own all-to-alls; the vocab-parallel softmax and top-k call ``comm``'s collectives.)

1. Every rank's queries (ids, and the row lengths of multi-hot samples) go to every rank, an
   allgather: every rank sees them all in one order, rank 0's first.
2. Each rank that owns a slice answers every query: a row slice with the full width (its rows,
   zeros for ids outside them), a table or column slice with its columns. A rank that owns no
   slice answers nothing, an empty send on the tape, so it runs every collective both ways.
3. The answers go back to the ranks that asked, in one all-to-all.
4. The asker combines them by the columns each owner answers: answers for the same columns
   are summed (a row slice's zeros add nothing), and the column groups are joined in column
   order (a table slice is one group of one owner).

What the one exchange costs: the ids reach every rank, also the ranks that own no slice of a
table or column-sliced table. Each rank receives 8 bytes per id of each other rank against
``dim * 4`` bytes per row of its own ids (float32): over ``n`` ranks with as many ids each,
the ids are ``2 (n - 1) / dim`` of the rows (a quarter at dim 64 on 9 ranks).

The exchange is differentiable (the answers' all-to-all has a gradient, the reverse
all-to-all; the ids need none), so tables train through it.

Example:
    >>> columns = {0: (0, 8), 1: (8, 8)}  # two column slices of a dim-16 table
    >>> rows = ask_owners(ids, answer, columns, "mmde_lookup_user", counts=counts)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.lookup import pooled_lookup


def ask_owners(
    ids, answer, columns, name: str, *, counts=None, lengths=None, sequence=False, anchor=None
):
    """This rank's rows, answered by the ranks that own them: ``[samples or ids, width]``.

    Args:
        ids: This rank's ids (the queries), flat.
        answer: ``answer(all_ids, all_lengths)``: this rank's answers to every rank's queries
            (in rank order), ``[queries or samples, cols]``; called where this rank owns a slice.
        columns: ``{rank: (col_start, cols)}``, the columns each owning rank answers (the same
            on every rank); ranks not in it own no slice.
        name: The collectives' common name; every rank passes the same.
        counts: int32 ``[ranks]``: the answers each rank gets, where one-hot ids vary in count
            by rank; None: every rank has as many samples as this one.
        lengths: Row lengths of multi-hot ids (every rank as many samples as this one).
        sequence: One answer per id of multi-hot ids (else one per sample).
        anchor: Where this rank owns no slice, its send: an empty tensor in the answers'
            dtype that reads a trainable weight, so this rank's send is on the tape as the
            owners' sends (they read the table) and it runs the backward all-to-all too.
    """
    n, rank = comm.size(), comm.rank()
    all_ids = comm.allgather(ids, f"{name}_ids")
    all_lengths = comm.allgather(lengths, f"{name}_lengths") if lengths is not None else None
    if sequence:  # one row per id: each rank gets back as many rows as it sent ids
        counts = tf.cast(tf.reduce_sum(tf.reshape(all_lengths, [n, -1]), axis=1), tf.int32)
    elif counts is None:
        samples = tf.size(ids) if lengths is None else tf.size(lengths)
        counts = tf.fill([n], tf.cast(samples, tf.int32))
    mine = columns.get(rank)
    if mine is None:
        if anchor is None:
            raise ValueError(
                f"Rank {rank} owns no slice of the rows asked by {name!r} and has nothing to "
                "send: pass its empty send. Received: anchor=None"
            )
        # the send reads the queries: a graph prunes a collective whose output nobody reads,
        # and the owners would wait for this rank's allgather forever
        flat = anchor + tf.cast(tf.minimum(tf.size(all_ids), 0), anchor.dtype)
    else:
        flat = tf.reshape(answer(all_ids, all_lengths), [-1])
    received, _ = comm.alltoall(flat, counts * (mine[1] if mine else 0), f"{name}_rows")
    return _combined(received, counts[rank], columns, n)


def _combined(received, count, columns, n):
    """``[count, width]`` from the answers received (owner after owner, in rank order): the
    answers of owners of the same columns summed, the column groups side by side."""
    groups: dict = {}
    for j in sorted(columns):
        groups.setdefault(columns[j], []).append(j)
    if len(groups) == 1 and len(columns) == n:  # every rank answers every column: one sum
        cols = next(iter(groups))[1]
        return tf.reduce_sum(tf.reshape(received, [n, -1, cols]), axis=0)
    sizes = [count * columns[j][1] if j in columns else tf.constant(0, tf.int32) for j in range(n)]
    pieces = tf.split(received, tf.stack(sizes), num=n)
    joined = [
        tf.add_n([tf.reshape(pieces[j], [-1, cols]) for j in owners])
        for (_, cols), owners in sorted(groups.items())
    ]
    return joined[0] if len(joined) == 1 else tf.concat(joined, axis=1)


def every_rank(cols: int) -> dict:
    """``columns`` of :func:`ask_owners` where every rank answers all ``cols`` columns."""
    return {j: (0, cols) for j in range(comm.size())}


def row_sliced_lookup(
    var, shard, ids, name: str, counts=None, lengths=None, combiner=None, dtype=None
):
    """This rank's rows of a row-sliced table: ``[samples, dim]`` (pooled) or one row per id.

    Args:
        var: This rank's slice of the table (rows ``shard.row_start`` on).
        shard: The slice (its ``row_start`` and ``rows``).
        ids: This rank's ids, flat.
        name: The collectives' common name; every rank passes the same.
        counts: int32 ``[ranks]``: the ids of each rank, for one-hot ids of varying counts;
            None: every rank has as many samples as this one.
        lengths: Row lengths of multi-hot ids (every rank as many samples as this one).
        combiner: How multi-hot ids of a sample pool; None with ``lengths``: one row per id.
        dtype: The dtype rows are read into (None: ``var``'s).
    """
    sequence = lengths is not None and combiner is None

    def answer(all_ids, all_lengths):
        return pooled_lookup(
            var,
            all_ids,
            combiner=combiner,
            row_lengths=None if sequence else all_lengths,
            row_range=(shard.row_start, shard.rows),
            dtype=dtype,
        )

    return ask_owners(
        ids,
        answer,
        every_rank(var.shape[1]),
        name,
        counts=counts,
        lengths=lengths,
        sequence=sequence,
    )
