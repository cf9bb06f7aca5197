"""Backends that execute a ShardingPlan: ``horovod`` (built in) and ``distributed-embeddings``.

``registry`` maps names to classes without importing TensorFlow; ``base`` is the interface.
"""

from merlin_models_de.backends.registry import BACKEND_NAMES, create, resolve

__all__ = ["BACKEND_NAMES", "create", "resolve"]
