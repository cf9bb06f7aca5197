"""Generator inputs that log nothing when tf.data rewrites them: the same batches.

When an iterator of a ``tf.data`` input starts, tf.data rewrites the input's graph (its
default static optimizations: fusions, no-op removal, injected prefetches). For a dataset
of ``Dataset.from_generator`` the rewrite's shape inference tries to evaluate the
generator's placeholder, and TensorFlow logs "Executor start aborting ... You must feed a
value for placeholder tensor 'Placeholder/_0'" (two lines) on every rank for each ``fit``,
``evaluate`` and ``predict``. So:

- the package's own generator inputs are made by :func:`generator_dataset`, whose
  generator sits inside a ``flat_map``, out of the rewrites' way;
- Keras' dataset of a Merlin ``Loader`` (a Keras ``Sequence``), inside ``fit`` /
  ``evaluate`` / ``predict`` of a model with the block on several ranks: the declared
  patch of ``GeneratorDataAdapter.get_dataset`` (:func:`install_quiet_generator_input`).
  Keras makes that dataset itself, so its rewrites are turned off instead
  (:func:`without_static_rewrites`): a Python generator, then a prefetch, has nothing they
  improve. Other models' inputs, and every input in one process, are Keras' own.

Example:
    >>> data = generator_dataset(batches, {"ids": tf.TensorSpec([None], tf.int64)})  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

from merlin_models_de.compat.registry import declare, replace

_ADAPTER = "keras.engine.data_adapter"
_GET_DATASET = declare(
    f"{_ADAPTER}.GeneratorDataAdapter.get_dataset",
    change="inside fit / evaluate / predict of a model with the block on several ranks, "
    "returns Keras' dataset with tf.data's default static optimizations off (the same "
    "batches); otherwise Keras' own.",
    why="those rewrites log two 'Executor start aborting' lines per rank and call for a "
    "generator's dataset (a Merlin Loader), and improve nothing there.",
    library="keras",
)


def generator_dataset(generator, output_signature):
    """``Dataset.from_generator(generator, output_signature)`` inside a ``flat_map``: the same
    elements, and tf.data's rewrites (kept: skipping them cost 5% of the DLRM job's
    throughput) no longer meet the generator's placeholder, so nothing is logged."""
    import tensorflow as tf

    return tf.data.Dataset.range(1).flat_map(
        lambda _: tf.data.Dataset.from_generator(generator, output_signature=output_signature)
    )


def without_static_rewrites(dataset):
    """``dataset`` read without tf.data's default static optimizations (same elements)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    return dataset.with_options(options)


def install_quiet_generator_input(active: Callable[[], bool]) -> None:
    """Keras' generator and ``Sequence`` datasets read without the static rewrites while
    ``active()`` (the scope of a model with the block on several ranks; idempotent)."""
    adapter = importlib.import_module(_ADAPTER).GeneratorDataAdapter

    def wrap(original):
        @functools.wraps(original)
        def get_dataset(self):
            dataset = original(self)
            return without_static_rewrites(dataset) if active() else dataset

        return get_dataset

    replace(_GET_DATASET, adapter, wrap)


__all__ = ["generator_dataset", "install_quiet_generator_input", "without_static_rewrites"]
