"""Makes ``merlin.models.tf.DistributedEmbeddings`` this package's block and installs the
Merlin training integration (:mod:`merlin_models_de.integration`, inert for models without
the block), without importing
Merlin Models (whose import calls ``hvd.init()`` when Horovod is installed) or TensorFlow.

If ``merlin.models.tf`` is already imported, the attribute is set now; otherwise a small
import hook sets it right after ``merlin.models.tf`` finishes importing. Idempotent.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGET = "merlin.models.tf"


def _attach(module) -> None:
    layer = sys.modules.get("merlin_models_de.layer")
    if layer is not None and not hasattr(layer, "DistributedEmbeddings"):
        return  # merlin.models.tf was imported by layer.py itself; layer.py registers at its end
    from merlin_models_de.integration import install
    from merlin_models_de.layer import DistributedEmbeddings

    if getattr(module, "DistributedEmbeddings", None) is not DistributedEmbeddings:
        module.DistributedEmbeddings = DistributedEmbeddings
    install()


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


def register() -> None:
    """Makes ``mm.DistributedEmbeddings`` this package's block (idempotent)."""
    if TARGET in sys.modules:
        _attach(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
