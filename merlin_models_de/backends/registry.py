"""Backend names -> backend classes, and what ``backend="auto"`` picks (no TensorFlow import).

The layer, the DLRM command and the bench all read their backend names from here.

Example:
    >>> BACKEND_NAMES
    ('auto', 'horovod', 'distributed-embeddings')
    >>> is_installed("horovod")
    True
"""

from __future__ import annotations

import importlib
import importlib.util

from merlin_models_de import comm
from merlin_models_de.planner.strategies import NVIDIA_STRATEGIES

AUTO = "auto"
# name -> "module:class"; in the order "auto" prefers them (first one that can run the features)
_CLASSES = {
    "distributed-embeddings": "merlin_models_de.backends.distributed_embeddings:DistributedEmbeddingsBackend",
    "horovod": "merlin_models_de.backends.horovod.backend:HorovodBackend",
}
BACKEND_NAMES = (AUTO, "horovod", "distributed-embeddings")
# the Python package a backend needs, besides TensorFlow (None: nothing more)
_REQUIRES = {"horovod": None, "distributed-embeddings": "distributed_embeddings"}
_DE_MODULE = "distributed_embeddings.python.layers.dist_model_parallel"


def check_name(backend: str) -> None:
    """Raises ValueError naming ``backend`` unless it is one of :data:`BACKEND_NAMES`."""
    if backend not in BACKEND_NAMES:
        raise ValueError(
            f"Unknown backend; expected one of {list(BACKEND_NAMES)}. "
            f"Received: backend={backend!r}"
        )


def is_installed(name: str) -> bool:
    """True when the package backend ``name`` needs is on the path (found, not imported)."""
    check_name(name)
    package = _REQUIRES.get(name)
    return package is None or importlib.util.find_spec(package) is not None


def is_importable(name: str) -> bool:
    """True when backend ``name`` can run here (distributed-embeddings: its ops load)."""
    if not is_installed(name):
        return False
    if name != "distributed-embeddings":
        return True
    try:
        importlib.import_module(_DE_MODULE)
    except Exception:  # noqa: BLE001  # its .so may fail to load, too
        return False
    return True


def backend_class(name: str):
    """The backend class called ``name`` (imports its module)."""
    check_name(name)
    if name == AUTO:
        raise ValueError("backend='auto' is resolved first; see resolve()")
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def resolve(
    backend: str, features=(), exchange_dtype=None, table_dtype=None, *, strategy="basic"
) -> str:
    """The backend that runs ``features``: ``auto`` picks the first one in preference order
    that imports and supports every feature and the placement ``strategy``
    (distributed-embeddings, then horovod).

    Inside ``comm.single_process()`` (the copy made for export) always ``horovod``:
    distributed-embeddings reads Horovod's world size itself; plain TF serves anywhere.
    """
    check_name(backend)
    if comm.overridden():
        return "horovod"
    if backend != AUTO:
        return backend
    for name in _CLASSES:
        if (
            is_importable(name)
            and backend_class(name).unsupported(features, exchange_dtype, table_dtype) is None
            and (name != "distributed-embeddings" or strategy in NVIDIA_STRATEGIES)
        ):
            return name
    return "horovod"


def create(name: str, plan, features, rank: int, **options):
    """Instantiates the (already resolved) backend ``name`` for this rank; ``options``: see
    :class:`merlin_models_de.backends.base.EmbeddingBackend`."""
    check_name(name)
    if not is_importable(name):
        raise ImportError(
            f"backend={name!r} needs NVIDIA distributed-embeddings, which does not import here "
            "(scripts/install_distributed_embeddings.sh installs it on GPU machines); "
            "backend='auto' falls back to 'horovod'. Received: backend="
            f"{name!r}"
        )
    return backend_class(name)(plan, features, rank, **options)
