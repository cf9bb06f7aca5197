"""Every use of Merlin Models', Horovod's and NVTabular's private API, behind a version check.

What is patched, and when (the whole list; nothing else in the package touches private API):

- On the first ``DistributedEmbeddings`` construction (:func:`install_merlin_hooks`, called by
  :mod:`merlin_models_de.merlin.hooks`): Merlin's ``BaseModel.compile``, ``BaseModel.evaluate``,
  ``BaseModel._add_horovod_callbacks`` and the ``save`` of every model class in
  ``merlin.models.tf.models.base`` are wrapped. The wrappers call the original for models
  without the block, or on one rank.
- :func:`distributed_optimizer` replaces two private methods of one
  ``hvd.DistributedOptimizer`` instance (``_allreduce_grads``, ``_allreduce``).
- :func:`create_optimizer_slots` calls a Keras optimizer's slot creation (Keras-private too;
  the only other Keras-private call is the layer walk in :mod:`merlin_models_de.variables`).
- :func:`take_local_rows` resets a Merlin ``Loader``'s sharding attributes.
- :func:`keras_names_kept` restores Keras' layer-name counters (``keras.backend``) after
  rank 0 alone builds layers (the export's copy of the model).
- :func:`same_randomness_on_every_rank` reads and restores the Python generators that Keras
  draws unseeded initializers' seeds from (``random`` and ``keras.backend._SEED_GENERATOR``).
- :mod:`merlin_models_de.compat.nvtabular` (serving, NVTabular 23.8 only): a fitted
  ``Categorify``'s state moved into the package's ``ValueCategorify`` (``with_class``) and
  the path of its fitted vocabulary (``vocabulary_path``).
- :func:`match_schemas` resets the ``_schema`` of layers of a ``from_config`` copy of a model
  (Merlin 23.8's ``SequentialBlock`` gives every later layer its first layer's schema on
  construction, so a copy is not the model it came from).

The installed versions are checked at first use (:func:`ensure_supported`): outside
:data:`SUPPORTED` the package stops with one message naming what it found, instead of
misbehaving later. ``MERLIN_MODELS_DE_SKIP_VERSION_CHECK=1`` turns the check off (at your risk).

Example:
    >>> from merlin_models_de import compat
    >>> compat.check_versions({"tensorflow": "2.12.1", "merlin-models": "23.8.0",
    ...                        "horovod": "0.28.1"})
"""

from __future__ import annotations

from merlin_models_de.compat.versions import (
    SKIP_ENV,
    SUPPORTED,
    UnsupportedVersionError,
    check_versions,
    ensure_supported,
    installed_versions,
)
