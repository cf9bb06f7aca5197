"""Every rank runs the same number of equal batches: checked before the first step.

Each step of the block exchanges embeddings across ranks, so a rank that ran out of batches
would leave the others waiting in a collective forever, and a short last batch of another
size on one rank fails that step. Before ``fit`` / ``evaluate`` / ``predict`` take a step,
each rank counts the batches of every input the call reads (``fit``: ``x`` and
``validation_data``) and the ranks compare counts, so that every rank raises the same
``ValueError`` naming each rank's count and the argument that fixes it.

Counted without reading the data: a Merlin ``Loader``, a Keras ``Sequence``, a
``tf.data.Dataset`` of known cardinality, and NumPy arrays / tensors (alone or in dicts,
lists, tuples), whose batches Keras cuts by ``batch_size`` (32 unless given) after
``validation_split``. Other inputs (generators, iterators, ``tf.data`` of unknown
cardinality) cannot be counted before they are read: they end together instead
(:mod:`.ending`).

Example:
    >>> check_counts("fit", [("x", loader, None, None, None, "steps_per_epoch")])  # doctest: +SKIP
"""

from __future__ import annotations

import math

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.compat import merlin as merlin_compat
from merlin_models_de.runtime import agree

KERAS_BATCH_SIZE = 32  # what Keras cuts arrays into when fit / evaluate / predict get none
UNKNOWN, INFINITE = -2, -1  # batch counts that are no count (tf.data's values)


def _merlin_dataset(data):
    """The Merlin ``Dataset`` that ``data`` reads (itself, or a ``Loader``'s), else None."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    if isinstance(data, mm.Loader):
        return data.dataset
    return data if isinstance(data, Dataset) else None


def partitions_problem(method, data, argument="x"):
    """Why ``data`` (a Merlin ``Dataset`` or ``Loader``) cannot feed every rank, or None.

    Merlin's ``Loader`` deals whole partitions to the ranks; with fewer partitions than ranks
    it fails with a bare ``IndexError`` (and a warning that suggests fewer processes)."""
    import merlin.models.tf as mm

    dataset = _merlin_dataset(data)
    ranks = data.global_size if isinstance(data, mm.Loader) else comm.size()
    if dataset is None or dataset.npartitions >= ranks:
        return None
    named = "" if argument == "x" else f"{argument}: "
    return (
        f"{method}: {named}the dataset has {dataset.npartitions} partition(s) for {ranks} "
        "ranks; Merlin's Loader gives each rank whole partitions, so a rank would get no "
        f"data. Repartition it to a multiple of {ranks} before making the loader: "
        f"ds = ds.repartition(npartitions={ranks}), then mm.Loader(ds, batch_size=B, "
        "drop_last=True) so that every rank runs the same number of equal batches."
    )


def array_rows(data):
    """Rows of array-like ``data`` (NumPy arrays, tensors, pandas objects, alone or nested in
    dicts / lists / tuples), None for other data. Raises when the arrays' rows differ (Keras
    would raise on this rank alone)."""
    leaves = [leaf for leaf in tf.nest.flatten(data) if leaf is not None]
    if not leaves or not all(_is_array(leaf) for leaf in leaves):
        return None
    rows = sorted({int(leaf.shape[0]) for leaf in leaves})
    if len(rows) > 1:
        raise ValueError(
            f"the arrays hold different numbers of rows: {rows}; every array of "
            "the inputs and targets needs one row per sample"
        )
    return rows[0]


def _is_array(leaf) -> bool:
    shape = getattr(leaf, "shape", None)
    if isinstance(leaf, (tf.data.Dataset, tf.keras.utils.Sequence)) or shape is None:
        return False
    try:
        return len(shape) > 0 and shape[0] is not None
    except TypeError:  # an unknown rank
        return False


def batch_count(data, batch_size=None, split=None):
    """``(batches per pass, rows of the short last batch)``: the count is ``UNKNOWN`` where it
    cannot be known without reading ``data`` and ``INFINITE`` for a repeated ``tf.data``; the
    last batch's rows are 0 (none short) or None (not known). ``split``: ``(fraction, part)``
    of ``fit``'s ``validation_split``, ``part`` "train" or "validation": the rows of arrays
    that this input reads, cut as Keras cuts them."""
    import merlin.models.tf as mm

    if isinstance(data, tf.data.Dataset):
        return int(data.cardinality()), None
    if isinstance(data, mm.Loader):
        last = 0 if data.drop_last else merlin_compat.loader_rows(data) % data.batch_size
        return len(data), last
    if isinstance(data, tf.keras.utils.Sequence):
        try:
            return len(data), None
        except TypeError:  # a Sequence over data of unknown length
            return UNKNOWN, None
    rows = array_rows(data)
    if rows is None:
        return UNKNOWN, None
    if split is not None:
        fraction, part = split
        train = int(math.floor(rows * (1.0 - fraction)))
        rows = train if part == "train" else rows - train
    size = batch_size or KERAS_BATCH_SIZE
    return math.ceil(rows / size), rows % size


def steps_run(count, last, steps):
    """``(batches, rows of the short last batch run)`` of one pass that stops after
    ``steps`` (None: at the data's end); ``UNKNOWN`` batches where only reading tells."""
    if steps is None:
        return count, last
    steps = int(steps)
    if count == INFINITE or (count >= 0 and count > steps):
        return steps, 0
    return count, last


def compare(method, what, plans, given):
    """Raises when ``plans`` (each rank's ``(batches, short last batch rows)``) differ;
    ``what``: the batches' name (``batches``, ``validation batches``), ``given``: the
    argument that sets the steps. Unknown counts end together instead (:mod:`.ending`)."""
    counts = [count for count, _ in plans]
    known = [count for count in counts if count >= 0]
    if UNKNOWN in counts:
        return
    empty_ranks(method, what, counts)
    if len(set(counts)) > 1:
        fewest = min(known) if known else 0
        raise ValueError(
            f"{method}: every rank must run the same number of {what} (each step exchanges "
            f"embeddings across ranks). {what.capitalize()} per rank: "
            f"{_by_rank(counts)}. Give every rank the same number of equal batches "
            f"(ds.repartition(npartitions=N) with N a multiple of {len(counts)}, partitions "
            f"of equal size, mm.Loader(..., drop_last=True), the same rows of arrays), or "
            f"pass {given}={fewest}."
        )
    lasts = [last for _, last in plans]
    if None not in lasts and len(set(lasts)) > 1:
        full = max(min(known) - 1, 0) if known else 0
        raise ValueError(
            f"{method}: the ranks' last {what} differ in size (each step exchanges embeddings "
            f"across ranks, so every rank's batch must be equal). Rows in the last batch per "
            f"rank: {_by_rank(lasts)}. Make the loader with mm.Loader(ds, batch_size=B, "
            f"drop_last=True) (arrays: rows that are a multiple of the batch size), or "
            f"pass {given}={full}."
        )


def empty_ranks(method, what, counts):
    """Raises when some rank has no batch of an input: on every rank, Keras' "Empty logs"
    (``fit``, ``predict``) or an empty result (``evaluate``); on some, a step count that
    trains nothing. The fix is in the data, or in fewer ranks."""
    empty = [rank for rank, count in enumerate(counts) if count == 0]
    if not empty:
        return
    source = what.replace(" batches", "") if what != "batches" else "x"
    why = "(no rows, or fewer rows than one batch with drop_last)"
    if len(empty) == len(counts):
        raise ValueError(
            f"{method}: {source} has no batches on any rank {why}: there is no data to read. "
            f"Batches per rank: {_by_rank(counts)}."
        )
    raise ValueError(
        f"{method}: {source} has no batches on rank(s) {empty} {why} while the others have "
        f"some. Batches per rank: {_by_rank(counts)}. Give every rank rows: repartition "
        f"the data (ds.repartition(npartitions=N) with N a multiple of {len(counts)}, "
        f"partitions of equal size), or run fewer ranks."
    )


def _by_rank(values):
    return {
        rank: ("unknown" if value == UNKNOWN else "infinite" if value == INFINITE else value)
        for rank, value in enumerate(values)
    }


def check_counts(method, inputs):
    """Counts every input of the call on this rank and compares every rank's counts,
    raising on every rank together before any step. ``inputs``: ``[(argument, data,
    batch_size, split, steps, the steps' argument)]`` (``split``: see :func:`batch_count`),
    the same arguments on every rank. Returns this rank's ``[(batches, last rows)]``."""

    def count():
        plans = []
        for argument, data, size, split, steps, _ in inputs:
            problem = partitions_problem(method, data, argument)
            if problem is not None:
                raise ValueError(problem)  # the same on every rank: each raises its own
            try:
                plans.append(steps_run(*batch_count(data, size, split), steps))
            except ValueError as err:
                raise ValueError(f"{method}: {argument}: {err}") from None
        return plans

    mine, shared = agree.on_every_rank(
        f"{method}: counting each rank's batches",
        count,
        share=lambda plans: plans,
        error_type=ValueError,
    )
    for index, (argument, _, _, _, _, given) in enumerate(inputs):
        what = "batches" if argument == "x" else f"{argument} batches"
        compare(method, what, [plans[index] for plans in shared], given)
    return mine


__all__ = [
    "INFINITE",
    "UNKNOWN",
    "array_rows",
    "batch_count",
    "check_counts",
    "partitions_problem",
    "steps_run",
]
