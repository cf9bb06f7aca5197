"""Every use of Merlin Models' and Horovod's private API, behind a version check.

What is patched, and when (the whole list; nothing else in the package touches private API):

- On the first ``DistributedEmbeddings`` construction (:func:`install_merlin_hooks`, called by
  :mod:`merlin_models_de.integration`): Merlin's ``BaseModel.compile``, ``BaseModel.evaluate``,
  ``BaseModel._add_horovod_callbacks`` and the ``save`` of every model class in
  ``merlin.models.tf.models.base`` are wrapped. The wrappers call the original for models
  without the block, or on one rank.
- :func:`distributed_optimizer` replaces two private methods of one
  ``hvd.DistributedOptimizer`` instance (``_allreduce_grads``, ``_allreduce``).
- :func:`create_optimizer_slots` calls a Keras optimizer's slot creation (Keras-private too;
  the only other Keras-private call is the layer walk in :mod:`merlin_models_de.variables`).
- :func:`take_local_rows` resets a Merlin ``Loader``'s sharding attributes.

The installed versions are checked at first use (:func:`ensure_supported`): outside
:data:`SUPPORTED` the package stops with one message naming what it found, instead of
misbehaving later. ``MERLIN_MODELS_DE_SKIP_VERSION_CHECK=1`` turns the check off (at your risk).

Example:
    >>> from merlin_models_de import compat
    >>> compat.check_versions({"tensorflow": "2.12.1", "merlin-models": "23.8.0",
    ...                        "horovod": "0.28.1"})
"""
from __future__ import annotations

import importlib.metadata
import os

from merlin_models_de import comm

# distribution -> supported release prefixes (major.minor)
SUPPORTED = {"tensorflow": ("2.12",), "merlin-models": ("23.8",), "horovod": ("0.28",)}
SKIP_ENV = "MERLIN_MODELS_DE_SKIP_VERSION_CHECK"
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")
_MARK = "_mmde_hooks"
_state = {"checked": False}


class UnsupportedVersionError(RuntimeError):
    """An installed dependency is outside the versions this package was built against."""


def _version_of(distributions) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict:
    """``{name: version or None}`` for the dependencies in :data:`SUPPORTED`."""
    return {"tensorflow": _version_of(_TF_DISTRIBUTIONS),
            "merlin-models": _version_of(("merlin-models",)),
            "horovod": _version_of(("horovod",))}


def check_versions(installed: dict | None = None) -> None:
    """Raises :class:`UnsupportedVersionError` when an installed version is unsupported.

    Args:
        installed: ``{name: version}``; the installed versions by default. A missing
            Horovod (None) is fine: one process needs none.
    """
    installed = installed_versions() if installed is None else installed
    bad = []
    for name, prefixes in SUPPORTED.items():
        found = installed.get(name)
        if found is None and name == "horovod":
            continue
        if found is None or not any(found == p or found.startswith(p + ".") for p in prefixes):
            bad.append(f"{name} {found or 'not installed'} (supported: "
                       f"{', '.join(p + '.*' for p in prefixes)})")
    if bad:
        raise UnsupportedVersionError(
            "merlin_models_de does not support the installed " + "; ".join(bad) +
            f". Install the supported versions (ci/requirements.txt), or set {SKIP_ENV}=1 to "
            "skip this check at your own risk.")


def ensure_supported() -> None:
    """:func:`check_versions` once per process (unless turned off by the environment)."""
    if _state["checked"] or os.environ.get(SKIP_ENV) == "1":
        return
    check_versions()
    _state["checked"] = True


# ---- Merlin Models ----------------------------------------------------------------------------


def install_merlin_hooks(hooks) -> None:
    """Wraps Merlin's ``BaseModel`` methods with ``hooks`` (idempotent).

    ``hooks`` provides ``active(model)`` (adjust this model?), ``compile(original, model,
    optimizer, *args, **kwargs)``, ``evaluate(original, model, *args, **kwargs)``,
    ``fit_callbacks(model, callbacks)`` and ``save(original, model, *args, **kwargs)``.
    """
    ensure_supported()
    from merlin.models.tf.models import base as merlin_base

    model_cls = merlin_base.BaseModel
    if getattr(model_cls, _MARK, False):
        return
    compile_, evaluate_ = model_cls.compile, model_cls.evaluate
    add_callbacks = model_cls._add_horovod_callbacks  # pylint: disable=protected-access

    def compile(self, optimizer="rmsprop", *args, **kwargs):  # pylint: disable=redefined-builtin
        if not hooks.active(self):
            return compile_(self, optimizer, *args, **kwargs)
        return hooks.compile(compile_, self, optimizer, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        if not hooks.active(self):
            return evaluate_(self, *args, **kwargs)
        return hooks.evaluate(evaluate_, self, *args, **kwargs)

    def _add_horovod_callbacks(self, callbacks):
        callbacks = add_callbacks(self, callbacks)
        return hooks.fit_callbacks(self, callbacks) if hooks.active(self) else callbacks

    model_cls.compile, model_cls.evaluate = compile, evaluate
    model_cls._add_horovod_callbacks = _add_horovod_callbacks  # pylint: disable=protected-access
    for cls in [c for c in vars(merlin_base).values()
                if isinstance(c, type) and issubclass(c, model_cls) and "save" in c.__dict__]:
        cls.save = _wrapped_save(cls.__dict__["save"], hooks)
    setattr(model_cls, _MARK, True)


def _wrapped_save(original, hooks):
    def save(self, *args, **kwargs):
        if not hooks.active(self):
            return original(self, *args, **kwargs)
        return hooks.save(original, self, *args, **kwargs)

    return save


def take_local_rows(loader):
    """Makes a Merlin ``Loader`` read every row of its dataset on this rank.

    Under Horovod, ``mm.Loader`` shards by partition and broadcasts a shuffling seed; a
    dataset that already holds only this rank's rows needs neither. (Its constructor turns a
    ``global_rank`` of 0 into ``hvd.rank()``, so the attributes are reset afterwards.)
    """
    ensure_supported()
    loader.global_size, loader.global_rank, loader.seed_fn = 1, 0, None
    return loader


# ---- Horovod --------------------------------------------------------------------------------


def distributed_optimizer(optimizer, is_local):
    """``hvd.DistributedOptimizer`` around ``optimizer`` that registers every variable for
    which ``is_local(var)`` holds as local, and names its allreduces by position among the
    allreduced gradients (the same on every rank, so graph-mode steps pair up)."""
    ensure_supported()
    comm.hvd()  # initialized
    import horovod.tensorflow.keras as hvd_keras

    wrapped = hvd_keras.DistributedOptimizer(optimizer, sparse_as_dense=True)
    reduce_grads = wrapped._allreduce_grads  # pylint: disable=protected-access
    allreduce = wrapped._allreduce  # pylint: disable=protected-access

    def generic_names(grads, variables=None, use_generic_names=True):
        del use_generic_names
        return reduce_grads(grads, variables, use_generic_names=True)

    def register_then_allreduce(grads, variables):
        for var in variables:
            if is_local(var):
                wrapped.register_local_var(var)
        return allreduce(grads, variables)

    wrapped._allreduce_grads = generic_names  # pylint: disable=protected-access
    wrapped._allreduce = register_then_allreduce  # pylint: disable=protected-access
    return wrapped


def is_horovod_optimizer(optimizer) -> bool:
    """True when ``optimizer`` is already one of Horovod's distributed optimizers."""
    return type(optimizer).__module__.startswith("horovod")


def is_horovod_broadcast_callback(callback) -> bool:
    """True for Horovod's ``BroadcastGlobalVariablesCallback`` (exactly that type)."""
    import horovod.tensorflow.keras as hvd_keras

    return type(callback) is hvd_keras.callbacks.BroadcastGlobalVariablesCallback


# ---- Keras ------------------------------------------------------------------------------------


def create_optimizer_slots(optimizer, variables) -> None:
    """Creates ``optimizer``'s slot variables for ``variables`` now (before restoring them)."""
    if optimizer is None:
        return
    inner = getattr(optimizer, "_optimizer", optimizer)  # Horovod's wrapper keeps the original
    for opt in {id(optimizer): optimizer, id(inner): inner}.values():
        if hasattr(opt, "_create_all_weights"):  # legacy Keras optimizers
            opt._create_all_weights(variables)  # pylint: disable=protected-access
            return
        if hasattr(opt, "build") and not getattr(opt, "_built", True):
            opt.build(variables)
            return
