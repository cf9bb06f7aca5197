"""Input checks that never leave a rank hanging in a collective.

Each rank counts its own problems (ids outside a table, features with another batch size)
*before* the input exchange and sends the count, with its batch size, in the exchange's
header. After the exchange every rank knows every rank's batch size and problem count, so all
ranks fail together: the rank with the bad input names the feature and the value, the
others name that rank. Nobody is left waiting in the next all-to-all.

Example:
    >>> bad, deferred = local_problems(inputs, features, tables, batch)  # doctest: +SKIP
"""
from __future__ import annotations

import tensorflow as tf


def local_problems(inputs, features, tables, batch):
    """Returns (problem count, deferred checks) for this rank's inputs, in a handful of ops.

    ``tables`` maps table name -> TableSpec. Deferred checks are ``(ok, data)`` to be turned
    into asserts after the exchange; their data names the feature and the offending value.
    """
    names = tf.constant([f.name for f in features])
    ids = tf.concat([i for i, _ in inputs], 0)
    counts = tf.stack([tf.size(i, out_type=tf.int64) for i, _ in inputs])
    which = tf.repeat(tf.range(len(features), dtype=tf.int64), counts)
    rows = tf.gather(tf.constant([tables[f.table].rows for f in features], tf.int64), which)
    outside = tf.logical_or(ids < 0, ids >= rows)
    first = tf.argmax(tf.cast(outside, tf.int32), output_type=tf.int64)
    n_bad = tf.reduce_sum(tf.cast(outside, tf.int64))
    bad_feature = tf.gather(names, tf.gather(which, first, axis=0)) if features else names
    sizes = tf.stack([tf.shape(l if l is not None else i, out_type=tf.int64)[0] for i, l in inputs])
    odd = tf.not_equal(sizes, batch)
    n_odd = tf.reduce_sum(tf.cast(odd, tf.int64))
    deferred = []
    if features:
        deferred.append((tf.equal(n_bad, 0), [
            "An id is outside its table. Received: feature=",
            tf.cond(n_bad > 0, lambda: bad_feature, lambda: tf.constant("")),
            "id=", tf.cond(n_bad > 0, lambda: tf.gather(ids, first), lambda: tf.constant(-1, tf.int64)),
            "(valid ids are 0..rows-1) rows=",
            tf.cond(n_bad > 0, lambda: tf.gather(rows, first), lambda: tf.constant(0, tf.int64))]))
        deferred.append((tf.equal(n_odd, 0), [
            f"Every feature must have the batch size of feature '{features[0].name}'. "
            "Received batch sizes per feature:", names, sizes]))
    return n_bad + n_odd, deferred


def check_headers(received, received_splits, batch, rank, world_size, deferred):
    """Asserts, in order: this rank's own problems, then every rank's batch size and count.

    ``received`` holds, per source rank, a segment starting with ``[batch, problems]``.
    """
    checks = []
    for ok, data in deferred:
        checks.append(tf.debugging.Assert(ok, data, summarize=64))
    with tf.control_dependencies(checks):
        starts = tf.cumsum(tf.cast(received_splits, tf.int64), exclusive=True)
        sizes = tf.gather(received, starts)
        problems = tf.gather(received, starts + 1)
        ranks = tf.range(world_size, dtype=tf.int64)
        checks.append(tf.debugging.Assert(
            tf.reduce_all(tf.equal(problems, 0)),
            [f"Invalid input on another rank (this is rank {rank}); see that rank's error. "
             "Problems per rank:", problems, "ranks:", ranks], summarize=64))
        checks.append(tf.debugging.Assert(
            tf.reduce_all(tf.equal(sizes, batch)),
            ["Every rank must feed the same per-rank batch size (drop or pad the uneven last "
             "batch, e.g. mm.Loader(..., drop_last=True)). Received batch sizes per rank:",
             sizes], summarize=64))
    return checks
