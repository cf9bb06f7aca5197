"""Makes ``merlin.models.tf.DistributedEmbeddings`` this package's block, without importing
Merlin Models (whose import calls ``hvd.init()`` when Horovod is installed) or TensorFlow.

The attribute is served lazily (a module-level ``__getattr__`` on ``merlin.models.tf``,
PEP 562): the block's module loads on first access, so registration never imports
:mod:`merlin_models_de.block.layer` and there is no import cycle. If ``merlin.models.tf`` is not
imported yet, a one-shot import hook adds the ``__getattr__`` right after its import. Right
after Merlin Models is imported (or at registration, when it already is), the Merlin hooks go
in too (:mod:`merlin_models_de.merlin.hooks`: inert for models without the block), so the
block itself never imports the output side. Idempotent.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

TARGET = "merlin.models.tf"
NAME = "DistributedEmbeddings"
_LAYER = "merlin_models_de.block.layer"
_HOOKS = "merlin_models_de.merlin.hooks"
# Every module of ours that registers Keras classes (``register_keras_serializable``). Keras
# rebuilds a saved model from its config only if each class in it is registered, and our
# modules load lazily: a loader imports all of them first (:func:`load_keras_classes`), or
# it revives a bare copy without Merlin's methods. tests/unit/test_serving_retrieval.py
# checks that this list names every such module.
KERAS_MODULES = (
    "merlin_models_de.block.layer",
    "merlin_models_de.block.handles",
    "merlin_models_de.block.views",
    "merlin_models_de.outputs.tied",
    "merlin_models_de.outputs.topk",
    "merlin_models_de.outputs.samplers",
    "merlin_models_de.outputs.rank_metrics",
    "merlin_models_de.kernels.rowwise.adagrad",
)


def _attach(module) -> None:
    from merlin_models_de.compat.merlin_hooks import serve_lazily

    serve_lazily(module, NAME, lambda: getattr(importlib.import_module(_LAYER), NAME))
    if NAME in module.__dict__:  # an older registration set it eagerly; serve it lazily now
        del module.__dict__[NAME]
    _install_hooks()


def _install_hooks() -> None:
    """The Merlin hooks, unless the installed versions are unsupported: then the block refuses
    at construction, naming them, and Merlin Models itself stays usable."""
    from merlin_models_de.compat.versions import UnsupportedVersionError

    try:
        importlib.import_module(_HOOKS).install()
    except UnsupportedVersionError:
        pass


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _attach(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``merlin.models.tf`` so registration follows its import."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; find the real spec without us
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def load_keras_classes() -> None:
    """Registers every Keras class of this package (imports :data:`KERAS_MODULES`; loads
    TensorFlow and Merlin Models)."""
    for name in KERAS_MODULES:
        importlib.import_module(name)


def register() -> None:
    """Makes ``mm.DistributedEmbeddings`` this package's block (idempotent)."""
    if TARGET in sys.modules:
        _attach(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
