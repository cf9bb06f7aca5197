"""The small interface every backend implements.

A backend executes one ShardingPlan on one rank: it creates that rank's variables, turns the
ordered list of inputs into the ordered list of outputs, and reads / writes whole tables
collectively.

Example:
    >>> backend = resolve("auto")  # doctest: +SKIP
"""
from __future__ import annotations

import abc


class EmbeddingBackend(abc.ABC):
    """Runs a plan on this rank. Subclasses set ``name``."""

    name = "base"

    @abc.abstractmethod
    def build(self, layer, initializer, trainable: bool) -> None:
        """Creates this rank's variables on ``layer``; ``initializer(table_name)`` gives one."""

    @abc.abstractmethod
    def call(self, inputs: list, training: bool = False) -> list:
        """Ordered list of ``(ids, row_lengths)`` -> ordered list of ``[batch, dim]`` outputs."""

    @abc.abstractmethod
    def local_variables(self) -> list:
        """Variables whose contents differ by rank (never allreduced or broadcast)."""

    @abc.abstractmethod
    def get_table(self, name: str, chunk_bytes: int):
        """Collective: the full table as a NumPy array on every rank."""

    @abc.abstractmethod
    def set_table(self, name: str, array, root_rank, chunk_bytes: int) -> None:
        """Collective: writes the full table ``array`` into the owners' shards."""


BACKENDS = ("auto", "horovod", "distributed-embeddings")


def distributed_embeddings_available() -> bool:
    """True when NVIDIA distributed-embeddings imports."""
    try:
        import distributed_embeddings.python.layers.dist_model_parallel  # noqa: F401
    except Exception:  # pylint: disable=broad-except  # its .so may fail to load, too
        return False
    return True


def resolve(backend: str) -> str:
    """``auto`` -> ``distributed-embeddings`` when importable, else ``horovod``."""
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend; expected one of {list(BACKENDS)}. "
                         f"Received: backend={backend!r}")
    if backend == "auto":
        return "distributed-embeddings" if distributed_embeddings_available() else "horovod"
    return backend
