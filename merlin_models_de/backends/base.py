"""The small interface every backend implements.

A backend executes one ShardingPlan on one rank: it creates that rank's variables, turns the
ordered list of inputs into the ordered list of outputs, and reads / writes whole tables
collectively.

Example:
    >>> backend = resolve("auto")  # doctest: +SKIP
"""
from __future__ import annotations

import abc

import numpy as np
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.planner.types import ShardingType


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
    def _local_block(self, shard):
        """(variable, first row) where this rank stores ``shard`` (one of its own shards)."""

    def get_table(self, name: str, chunk_bytes: int):
        """Collective: the full table as a NumPy array on every rank (moved in chunks)."""
        shards = self.plan.shards_of(name)
        if shards[0].kind is ShardingType.DATA_PARALLEL:
            return self._local_block(shards[0])[0].numpy()  # every rank has the whole table
        table = self.plan.table(name)
        out = np.zeros((table.rows, table.dim), np.float32)
        for s in shards:
            for lo, hi in _chunks(s.rows, s.cols, chunk_bytes):
                if s.rank == self.rank:
                    var, first = self._local_block(s)
                    data = var[first + lo:first + hi]
                else:
                    data = tf.zeros([hi - lo, s.cols], tf.float32)
                data = comm.broadcast(data, root_rank=s.rank)
                out[s.row_start + lo:s.row_start + hi, s.col_start:s.col_start + s.cols] = data
        return out

    def set_table(self, name: str, array, root_rank, chunk_bytes: int) -> None:
        """Collective: writes the full table ``array`` into the owners' shards."""
        table = self.plan.table(name)
        if array is not None and tuple(np.shape(array)) != (table.rows, table.dim):
            raise ValueError(f"Table '{name}' has shape {(table.rows, table.dim)}. "
                             f"Received: shape={tuple(np.shape(array))}")
        for s in self.plan.shards_of(name):
            for lo, hi in _chunks(s.rows, s.cols, chunk_bytes):
                if array is not None:
                    data = np.asarray(array[s.row_start + lo:s.row_start + hi,
                                            s.col_start:s.col_start + s.cols], np.float32)
                else:
                    data = np.zeros((hi - lo, s.cols), np.float32)
                if root_rank is not None:
                    data = comm.broadcast(tf.constant(data), root_rank=root_rank)
                if s.rank == self.rank:
                    var, first = self._local_block(s)
                    var[first + lo:first + hi].assign(data)


def _chunks(rows, cols, chunk_bytes):
    step = max(1, chunk_bytes // max(1, cols * 4))
    return [(lo, min(rows, lo + step)) for lo in range(0, rows, step)]


BACKENDS = ("auto", "horovod", "distributed-embeddings")


def distributed_embeddings_available() -> bool:
    """True when NVIDIA distributed-embeddings imports."""
    try:
        import distributed_embeddings.python.layers.dist_model_parallel  # noqa: F401
    except Exception:  # pylint: disable=broad-except  # its .so may fail to load, too
        return False
    return True


def resolve(backend: str, multi_hot: bool = False) -> str:
    """``auto`` -> ``distributed-embeddings`` when importable and the features are all one-hot
    (what it supports), else ``horovod``. Inside ``comm.single_process()`` (the copy made for
    export) always ``horovod``: DE reads Horovod's world size itself, and plain TF serves anywhere.
    """
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend; expected one of {list(BACKENDS)}. "
                         f"Received: backend={backend!r}")
    if comm.overridden():
        return "horovod"
    if backend == "auto":
        if not multi_hot and distributed_embeddings_available():
            return "distributed-embeddings"
        return "horovod"
    return backend
