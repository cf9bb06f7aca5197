"""Backends that execute a ShardingPlan: ``horovod`` (built in) and ``distributed-embeddings``."""
from merlin_models_de.backends.base import BACKENDS, EmbeddingBackend, resolve

__all__ = ["BACKENDS", "EmbeddingBackend", "resolve", "create"]


def create(name: str, plan, features, rank: int, validate_ids: bool = True) -> EmbeddingBackend:
    """Instantiates the (already resolved) backend ``name`` for this rank."""
    if name == "horovod":
        from merlin_models_de.backends.horovod import HorovodBackend

        return HorovodBackend(plan, features, rank, validate_ids=validate_ids)
    if name == "distributed-embeddings":
        from merlin_models_de.backends.base import distributed_embeddings_available

        if not distributed_embeddings_available():
            raise ImportError(
                "backend='distributed-embeddings' needs NVIDIA distributed-embeddings, which "
                "does not import here (scripts/install_distributed_embeddings.sh installs it "
                "on GPU machines); backend='auto' falls back to 'horovod'. Received: "
                "backend='distributed-embeddings'")
        from merlin_models_de.backends.distributed_embeddings import (
            DistributedEmbeddingsBackend)

        return DistributedEmbeddingsBackend(plan, features, rank, validate_ids=validate_ids)
    raise ValueError(f"Unknown backend; expected one of {list(BACKENDS)}. Received: backend={name!r}")
