"""Inputs whose length only reading tells end on every rank at the same batch.

A generator, an iterator or a ``tf.data.Dataset`` of unknown cardinality cannot be counted
before ``fit`` / ``evaluate`` / ``predict`` read it (:mod:`.batches` counts the others). On
several ranks such an input is read through :func:`ending_together`: before each batch is
handed to Keras, the ranks tell each other whether they have one (a one-integer allgather per
batch, on the input's thread), and every rank stops at the first batch some rank lacks. The
batches the other ranks still had are not read; rank 0 names each rank's batches then. Every
rank thus runs the same steps, and Keras ends the epoch (or, with ``steps_per_epoch`` above
what every rank had, says the input ran out) on every rank together.

Example:
    >>> x = ending_together("fit", "x", generator())  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import sys

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.compat.tf_data import generator_dataset

# Each wrapped input agrees under names of its own, numbered in the order every rank makes
# them: a batch one rank pulled ahead of a failed call can never answer another input's.
_numbers = itertools.count()


def ending_together(method: str, argument: str, data):
    """``data`` read so that every rank stops at the first batch some rank lacks: a
    ``tf.data.Dataset`` stays one (same element spec, read anew each epoch), anything else
    iterable becomes a generator."""
    name = f"mmde_{method}_{argument}_{next(_numbers)}_has_batch"
    if isinstance(data, tf.data.Dataset):
        return generator_dataset(lambda: _agreed(method, argument, data, name), data.element_spec)
    return _agreed(method, argument, data, name)


def _agreed(method, argument, data, name):
    read = 0
    for batch in itertools.chain(data, [None]):
        have = comm.allgather(tf.constant([batch is not None], tf.int32), name=name)
        have = have.numpy().tolist()
        if not all(have):
            if comm.rank() == 0 and any(have):
                _say_uneven(method, argument, read, have)
            return
        read += 1
        yield batch


def _say_uneven(method, argument, read, have):
    lacking = [rank for rank, has in enumerate(have) if not has]
    print(
        f"[merlin_models_de] {method}: {argument} ran out on rank(s) {lacking} after {read} "
        f"batches while the other ranks had more; every rank stopped there (each step "
        f"exchanges embeddings across ranks). Give every rank the same number of batches "
        f"(docs/training.md).",
        file=sys.stderr,
        flush=True,
    )


def needs_agreement(data) -> bool:
    """Is ``data`` an input whose length only reading tells (a generator, an iterator, a
    ``tf.data.Dataset`` of unknown cardinality)?"""
    if isinstance(data, tf.data.Dataset):
        return int(data.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    # a Merlin Loader or a Keras Sequence iterates too, but has a length (counted before the
    # first step, batches.py) and must reach Keras / Merlin as itself: Merlin's fit reads a
    # Loader's schema to drop the columns the model does not take
    return hasattr(data, "__next__") and not hasattr(data, "__len__")


__all__ = ["ending_together", "needs_agreement"]
