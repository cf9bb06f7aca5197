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

from merlin_models_de.backends.lookup import to_ids
from merlin_models_de.runtime import agree


def ordered_inputs(inputs, features, keys=frozenset()):
    """``{feature: value}`` -> (ordered ``(ids, row_lengths)`` list, problems). ``keys``:
    features of dynamic tables, whose ids are 64-bit keys (a uint64 above int64 is one).

    A feature that is missing or malformed (wrong rank, non-integer dtype, ...) becomes an
    empty-id placeholder of this rank's batch size and a message: the caller sends the count
    in the first exchange instead of raising here, alone, while the other ranks wait. A
    problem that only the values can tell (:func:`one_id_per_sample`) is an ``(ok, data)``
    check instead of a message, counted the same way.
    """
    ordered, problems = [], []
    for f in features:
        if f.name not in inputs:
            problems.append(
                f"Feature '{f.name}' is missing from the batch. Received keys: {sorted(inputs)}"
            )
            ordered.append(None)
            continue
        value = inputs[f.name]
        if getattr(value, "dtype", None) == tf.uint64 and f.name not in keys:
            # a dynamic table's keys are 64-bit: a uint64 above int64 wraps, one to one
            problems.append(ids_within_int64(value, f.name))
        if not f.multi_hot and _width_unknown(value):
            value, check = one_id_per_sample(value, f.name)
            problems.append(check)
        try:
            ordered.append(to_ids(value, f.name, f.multi_hot))
        except (ValueError, TypeError) as err:
            problems.append(str(err))
            ordered.append(None)
    present = [o for o in ordered if o is not None]
    if present:
        ids, lengths = present[0]
        batch = tf.shape(lengths if lengths is not None else ids, out_type=tf.int64)[0]
    else:
        batch = tf.constant(0, tf.int64)
    filled = []
    for f, value in zip(features, ordered):
        if value is None:
            value = (
                (tf.zeros([0], tf.int64), tf.zeros([batch], tf.int64))
                if f.multi_hot
                else (tf.zeros([batch], tf.int64), None)
            )
        filled.append(value)
    return filled, problems


def local_problems(
    inputs, features, tables, batch, problems=(), check_ids=True, require_samples=True
):
    """Returns (problem count, deferred checks) for this rank's inputs, in a handful of ops.

    Counted: ``problems`` found while reading the inputs (messages, or ``(ok, data)`` checks
    of the values), an empty batch (with ``require_samples``: several ranks must each feed
    samples), features whose batch size differs from ``batch`` and, with ``check_ids``, ids
    outside their table. ``tables`` maps table name -> TableSpec. Deferred checks are
    ``(ok, data)`` to be turned into asserts after the exchange; their data names the
    feature and the offending value.
    """
    deferred = [(tf.constant(False), [p]) if isinstance(p, str) else p for p in problems]
    empty = tf.logical_and(tf.equal(batch, 0), require_samples)
    failed = [tf.cast(tf.logical_not(ok), tf.int64) for ok, _ in deferred]
    deferred.append(
        (
            tf.logical_not(empty),
            [
                "Received an empty batch (batch size 0); every rank must feed at least one sample "
                "per step (mm.Loader(..., drop_last=True) drops a short last batch)."
            ],
        )
    )
    static = tf.add_n(failed + [tf.cast(empty, tf.int64)])
    if not check_ids:
        count, more = _odd_sizes(inputs, features, batch)
        return static + count, deferred + more
    names = tf.constant([f.name for f in features] + [""])
    row_counts = tf.constant([tables[f.table].rows for f in features] + [1], tf.int64)
    # one sentinel id (never outside) keeps argmax / gather defined when the batch holds no
    # ids at all. Built per feature, not by repeating each feature's index over its id
    # count: shape inference would try to evaluate those counts when Keras saves the model
    # (TF logs "Executor start aborting" for each try)
    ids = tf.concat([i for i, _ in inputs] + [tf.zeros([1], tf.int64)], 0)
    outside = tf.concat(
        [_outside(i, f, tables) for (i, _), f in zip(inputs, features)] + [tf.zeros([1], tf.bool)],
        0,
    )
    first = tf.argmax(tf.cast(outside, tf.int32), output_type=tf.int64)
    ends = tf.cumsum(tf.stack([tf.size(i, out_type=tf.int64) for i, _ in inputs] + [1]))
    feature = tf.searchsorted(ends, first[None], side="right")[0]  # the feature holding it
    n_bad = tf.reduce_sum(tf.cast(outside, tf.int64))
    bad_feature = tf.gather(names, feature)
    n_odd, odd_checks = _odd_sizes(inputs, features, batch)
    if features:
        deferred.append(
            (
                tf.equal(n_bad, 0),
                [
                    "An id is outside its table. Received: feature=",
                    bad_feature,
                    "id=",
                    tf.gather(ids, first),
                    "(valid ids are 0..rows-1) rows=",
                    tf.gather(row_counts, feature),
                ],
            )
        )
    return static + n_bad + n_odd, deferred + odd_checks


def _width_unknown(value) -> bool:
    """A dense ``[B, k]`` (or ``[B, k, 1]``) input whose ``k`` is unknown when traced: Keras
    feeds a generator's or a ``Sequence``'s ``[B, 1]`` batches as ``(None, None)``."""
    if (
        isinstance(value, (tf.RaggedTensor, tf.SparseTensor))
        or not hasattr(value, "shape")
        or not tf.as_dtype(value.dtype).is_integer
    ):
        return False  # (to_ids names a wrong dtype)
    shape = tf.TensorShape(value.shape)
    if shape.rank == 3 and shape[-1] == 1:
        shape = shape[:-1]
    return shape.rank == 2 and shape[-1] is None


def ids_within_int64(value, feature: str):
    """The ``(ok, data)`` check of a uint64 feature's ids: an id above int64's range lies
    outside every table, and once cast to int64 (every lookup's dtype) it would read, and be
    reported, as a negative number; the check names it as given."""
    if isinstance(value, tf.SparseTensor):
        value = value.values
    if isinstance(value, tf.RaggedTensor):
        value = value.flat_values
    flat = tf.reshape(value, [-1])
    largest = tf.reduce_max(tf.concat([flat, tf.zeros([1], tf.uint64)], 0))
    return (
        largest <= tf.constant(2**63 - 1, tf.uint64),
        [
            f"An id is outside its table (above int64's range). Received: feature={feature} id=",
            largest,
        ],
    )


def one_id_per_sample(value, feature: str):
    """A one-hot feature's ``[B, k]`` input of unknown ``k`` -> (its ``[B]`` first ids, the
    ``(ok, data)`` check that ``k`` is 1), checked at run time with the step's other input
    checks: an unknown width is not a wrong one. The ids are ``[B]`` whatever ``k`` is (a
    zero fills ``k = 0``), so only this check fails on a wrong width."""
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 3:
        value = tf.squeeze(value, axis=-1)
    shape = tf.shape(value, out_type=tf.int64)
    first = tf.concat([value[:, :1], tf.zeros(tf.stack([shape[0], 1]), value.dtype)], 1)[:, 0]
    return first, (
        tf.equal(shape[1], 1),
        [
            f"Feature '{feature}' is one-hot in the schema but its input has",
            shape[1],
            "ids per sample (one-hot takes [batch] or [batch, 1]). Received: shape=",
            shape,
        ],
    )


def batch_size(inputs):
    """This rank's batch size: the first feature's number of samples."""
    if not inputs:
        return tf.constant(0, tf.int64)
    ids, lengths = inputs[0]
    ref = lengths if lengths is not None else ids
    return tf.shape(ref, out_type=tf.int64)[0]


def ids_outside(inputs, features, tables):
    """Per feature, how many of its ids lie outside its table: what ``validate_ids=False``
    lets through (a row-sliced table reads zero rows for them), counted so it is reported."""
    if not features:
        return tf.zeros([0], tf.int64)
    return tf.stack(
        [
            tf.reduce_sum(tf.cast(_outside(ids, f, tables), tf.int64))
            for (ids, _), f in zip(inputs, features)
        ]
    )


def _outside(ids, feature, tables):
    """Which of ``feature``'s ids lie outside its table (a dynamic table's keys never do)."""
    if _is_dynamic(tables, feature):
        return tf.zeros_like(ids, tf.bool)
    return tf.logical_or(ids < 0, ids >= tables[feature.table].rows)


def _odd_sizes(inputs, features, batch):
    """(count, checks) of features whose batch size differs from ``batch``."""
    if not features:
        return tf.constant(0, tf.int64), []
    names = tf.constant([f.name for f in features])
    sizes = tf.stack([tf.shape(l if l is not None else i, out_type=tf.int64)[0] for i, l in inputs])
    n_odd = tf.reduce_sum(tf.cast(tf.not_equal(sizes, batch), tf.int64))
    return n_odd, [
        (
            tf.equal(n_odd, 0),
            [
                f"Every feature must have the batch size of feature '{features[0].name}'. "
                "Received batch sizes per feature:",
                names,
                sizes,
            ],
        )
    ]


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
        checks.append(agree.rank_problems_check(problems, rank, "input"))
        checks.append(
            tf.debugging.Assert(
                tf.reduce_all(tf.equal(sizes, batch)),
                [
                    "Every rank must feed the same per-rank batch size (drop or pad the uneven last "
                    "batch, e.g. mm.Loader(..., drop_last=True)). Received batch sizes per rank:",
                    sizes,
                ],
                summarize=64,
            )
        )
    return checks


def _is_dynamic(tables, feature) -> bool:
    """A dynamic table's ids are keys: any int64 is one (no row range to check)."""
    return getattr(tables[feature.table], "dynamic", None) is not None
