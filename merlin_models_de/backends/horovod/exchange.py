"""Queries to every owner, answers back: the exchange of row-sliced tables and catalogs.

A row-sliced table (and a row-sharded catalog, ``outputs/vocab_parallel.py``) has an owner for
every id on every rank, so the queries of each rank go to every rank (an allgather), each rank
answers the queries it holds rows for, and the answers travel back to the rank that asked (an
all-to-all, each rank's answers in the asker's order), where the partial answers are combined.
The two halves are ``comm.allgather`` and ``comm.alltoall``: the block's lookups of row-sliced
tables and the table handles' lookups of arbitrary ids (``table_lookup.py``) run them here,
the vocab-parallel softmax and top-k call them directly. Both halves are differentiable (Horovod registers their gradients), so tables train
through them.

Example:
    >>> rows = row_sliced_lookup(var, shard, ids, "mmde_user_rw", counts)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.lookup import pooled_lookup


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
    all_ids = comm.allgather(ids, f"{name}_ids")
    all_lengths = comm.allgather(lengths, f"{name}_lengths") if lengths is not None else None
    sequence = lengths is not None and combiner is None
    partial = pooled_lookup(
        var,
        all_ids,
        combiner=combiner,
        row_lengths=None if sequence else all_lengths,
        row_range=(shard.row_start, shard.rows),
        dtype=dtype,
    )
    return answers_summed(partial, ids, lengths, all_lengths, sequence, name, counts)


def answers_summed(answers, ids, lengths, all_lengths, sequence: bool, name: str, counts=None):
    """Every rank's partial answers (to every rank's queries, in rank order) back to the rank
    that asked, summed over the answering ranks: ``[this rank's samples or ids, width]``.

    ``ids``, ``lengths``: this rank's queries; ``all_lengths``: every rank's row lengths;
    ``sequence``: one answer per id (else per sample); ``counts``: int32 ``[ranks]`` answers
    to each rank where its samples vary (None: every rank as many as this one)."""
    n = comm.size()
    if sequence:  # one row per id: each rank gets back as many rows as it sent ids
        counts = tf.cast(tf.reduce_sum(tf.reshape(all_lengths, [n, -1]), axis=1), tf.int32)
    elif counts is None:
        samples = tf.size(ids) if lengths is None else tf.size(lengths)
        counts = tf.fill([n], tf.cast(samples, tf.int32))
    received, _ = comm.alltoall(answers, counts, f"{name}_rows")
    return tf.reduce_sum(tf.reshape(received, [n, -1, answers.shape[1]]), axis=0)
