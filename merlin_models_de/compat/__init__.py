"""Every use of Merlin Models', Horovod's and NVTabular's private API, behind a version check.

What is patched: every replacement of a Keras, Merlin Models, Horovod or TensorFlow attribute
is declared in :mod:`.registry` and made through :func:`.registry.replace`; :func:`patches`
lists them all (docs/training.md shows that list, checked by tests/unit/test_patches.py).
Each replacement behaves as the original for what is not the package's (models without the
block, variables that are not its tables).

The other private uses, which replace nothing:

- :func:`.keras.create_optimizer_slots` calls a Keras optimizer's slot creation;
  :func:`.keras.hand_over_weights` moves variables between Keras layers' weight lists;
  :func:`.keras.forget_validation_data` drops ``fit``'s cached validation data;
  :class:`.keras.UntrackedSublayersMixin` and :class:`.tf_checkpoint.TableCheckpointMixin`
  extend Keras' / TensorFlow's private walks in the package's own layer classes.
- :func:`.keras.keras_names_kept` restores Keras' layer-name counters (``keras.backend``) after
  rank 0 alone builds layers (the export's copy of the model).
- :func:`.keras.same_randomness_on_every_rank` reads and restores the Python generators that
  Keras draws unseeded initializers' seeds from (``random`` and ``keras.backend._SEED_GENERATOR``).
- :func:`.merlin.take_local_rows` resets a Merlin ``Loader``'s sharding attributes;
  :func:`.merlin.match_schemas` resets the ``_schema`` of layers of a ``from_config`` copy of a
  model (Merlin 23.8's ``SequentialBlock`` gives every later layer its first layer's schema).
- :mod:`.horovod`: Horovod elastic's retry loop, reset and ``ObjectState``, and its launcher's
  argument parser.
- :mod:`.nvtabular` (serving, NVTabular 23.8 only): a fitted ``Categorify``'s state moved into
  the package's ``ValueCategorify`` (``with_class``) and the path of its fitted vocabulary.
- :mod:`.tf_checkpoint`: a restore's deferred dependencies of the block.

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

# the compat modules that declare patches (imported by patches(): none loads a library)
_PATCHING = ("keras", "merlin_hooks", "horovod", "tf_checkpoint", "tf_data")


def patches() -> list:
    """Every patch the package may make (:class:`.registry.Patch`), by target: declared when
    the compat modules are imported, so the list is whole before any of them goes in."""
    import importlib

    from merlin_models_de.compat import registry

    for name in _PATCHING:
        importlib.import_module(f"{__name__}.{name}")
    return registry.declared()


def patches_markdown() -> str:
    """:func:`patches` as docs/training.md lists them."""
    from merlin_models_de.compat import registry

    patches()
    return registry.markdown()
