"""Backends that execute a ShardingPlan: ``horovod`` (built in) and ``distributed-embeddings``."""
from merlin_models_de.backends.base import BACKENDS, EmbeddingBackend, resolve

__all__ = ["BACKENDS", "EmbeddingBackend", "resolve", "create"]


def create(name: str, plan, features, rank: int, validate_ids: bool = True) -> EmbeddingBackend:
    """Instantiates the (already resolved) backend ``name`` for this rank."""
    if name == "horovod":
        from merlin_models_de.backends.horovod import HorovodBackend

        return HorovodBackend(plan, features, rank, validate_ids=validate_ids)
    if name == "distributed-embeddings":
        raise NotImplementedError(
            "backend='distributed-embeddings' is not wired in yet (see the open issue); "
            "use backend='horovod'. Received: backend='distributed-embeddings'")
    raise ValueError(f"Unknown backend; expected one of {list(BACKENDS)}. Received: backend={name!r}")
