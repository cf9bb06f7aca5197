"""The interface every backend implements, and what all backends share.

A backend executes one ShardingPlan on one rank: it creates that rank's variables, turns the
ordered list of inputs into the ordered list of outputs, and reads / writes whole tables
collectively. The base class does what must not differ between backends:

- ``build`` creates the variables through the backend, then marks the backend's local
  variables (a backend cannot forget it, and an unmarked shard would be allreduced);
- ``call`` counts this rank's input problems, makes the two-number header (batch size,
  problem count) and hands both to the backend's own exchange, which must deliver the header
  to every rank in its first collective (or call :meth:`exchange_header`) and run the checks
  before any lookup, so bad input fails on every rank at once. A training step that brings
  the next batch (``following``) goes to :meth:`step_ahead` instead, which backends that send
  ids a step ahead implement (their checks travel with the ids);
- ``get_table`` / ``set_table`` move whole tables through :meth:`shard_variable`.

Example:
    >>> backend = create("horovod", plan, features, rank=0)  # doctest: +SKIP
    >>> backend.shard_variable(plan.shards_on(0)[0])  # doctest: +SKIP
"""

from __future__ import annotations

import abc
import zlib
from typing import Callable, ClassVar

import numpy as np
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.memory import check_fits, host_memory_bytes
from merlin_models_de.backends.options import exchange_dtype_name
from merlin_models_de.backends.validate import (
    batch_size,
    check_headers,
    ids_outside,
    local_problems,
)
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.kernels.rounding import RoundedTables, is_narrow, mark_rounded_tables
from merlin_models_de.planner.types import Shard, ShardingPlan, ShardingType
from merlin_models_de.runtime import agree
from merlin_models_de.tables import table_dtype_name
from merlin_models_de.variables import TableMark, mark_local, mark_table


class EmbeddingBackend(abc.ABC):
    """Runs a plan on this rank.

    Args:
        plan: The placement (same on every rank).
        features: The ordered feature list (the input list order).
        rank: This process's rank.
        validate_ids: Count ids outside their table as problems (see ``validate``).
        exchange_dtype: The float looked-up rows and their gradients cross ranks in (see
            :mod:`.options`); None: the block's dtype.
        table_dtype: The float model-parallel shards are stored in (see
            :mod:`merlin_models_de.kernels.rounding`); None: the block's dtype. Replicated tables
            keep the block's dtype: their gradients are averaged with the dense ones.
    """

    name: ClassVar[str] = "base"

    def __init__(
        self,
        plan: ShardingPlan,
        features,
        rank: int,
        validate_ids: bool = True,
        exchange_dtype: str | None = None,
        table_dtype: str | None = None,
    ):
        features = tuple(features)
        problem = self.unsupported(features, exchange_dtype, table_dtype)
        if problem is not None:
            raise NotImplementedError(problem)
        self.plan: ShardingPlan = plan
        self.features = features
        self.rank: int = rank
        self.world_size: int = plan.world_size
        self.validate_ids = validate_ids
        self.exchange_dtype = exchange_dtype_name(exchange_dtype)
        self.tables = {t.name: t for t in plan.tables}
        self.prefix = "mmde"
        self.dtype = tf.float32  # the layer's variable dtype, set by build()
        self.table_dtype_option = table_dtype_name(table_dtype)
        self.table_dtype = tf.float32  # the shards' dtype, set by build()
        self.out_of_range = None  # per-feature counts of unchecked ids, set by build()
        self._built = False

    @classmethod
    def unsupported(cls, features, exchange_dtype=None, table_dtype=None) -> str | None:
        """Why this backend cannot run ``features`` with ``exchange_dtype`` and
        ``table_dtype`` (a message naming the feature or option), or None."""
        del features, exchange_dtype, table_dtype
        return None

    # ---- variables -------------------------------------------------------------------------

    def build(self, layer, initializer: Callable, trainable: bool) -> None:
        """Creates this rank's variables on ``layer`` (idempotent) and marks the local ones.

        ``initializer(table_name)`` gives a Keras initializer; ``trainable`` is a bool, or
        ``trainable(table_name) -> bool`` for backends that take it per table (horovod).
        """
        if self._built:
            return
        # the block's name and tables (the same on every rank): two blocks of one name (a
        # two-tower model's towers, each "embeddings") must not share collective names
        tables = ",".join(sorted(t.name for t in self.plan.tables)).encode()
        self.prefix = f"mmde_{layer.name}_{zlib.crc32(tables):08x}".replace("/", "_")
        self.dtype = tf.as_dtype(layer.dtype or "float32")
        self.table_dtype = tf.as_dtype(self.table_dtype_option or self.dtype)
        if not tf.config.list_logical_devices("GPU"):  # device memory is not known up front
            check_fits(self.plan, self.table_dtype.size, comm.local_size(), host_memory_bytes())
        # each rank initializes its own shards; later layers must not start differently
        with keras_compat.same_randomness_on_every_rank(draws=len(self.plan.tables)):
            # on several ranks each shard gets its own seed (see backends/shard_init.py)
            self.init_seeds = (
                keras_compat.initializer_seeds() if self.world_size > 1 else (None, None)
            )
            self.create_variables(layer, initializer, trainable)
        for var in self.local_variables():
            mark_local(var)
        self._mark_tables()
        # validate_ids=False on several ranks: ids outside their table are counted per feature
        # instead (a row-sliced table reads zero rows for them). Held outside Keras' tracking:
        # not a weight, never saved (a saved model is a one-process copy, which has no counter).
        self.out_of_range = (
            tf.Variable(
                tf.zeros([len(self.features)], tf.int64), trainable=False, name="out_of_range_ids"
            )
            if not self.validate_ids and self.world_size > 1
            else None
        )
        self._built = True

    def _mark_tables(self) -> None:
        """Marks each shard's variable with its table, for optimizers that keep state per
        row (``rowwise``); a variable holding several shards (a backend merged them) is
        marked not ``whole``."""
        for s in self.plan.shards_on(self.rank):
            var, first = self.shard_variable(s)
            dim = self.plan.table(s.table).dim
            whole = first == 0 and tuple(var.shape) == (s.rows, s.cols)
            mark_table(
                var, TableMark(s.table, dim, s.cols, whole, id(self), s.row_start, s.col_start)
            )
        # 16-bit tables: every rank learns which, for the range check it joins (rowwise)
        stored = [
            t.name
            for t in self.plan.tables
            if self.plan.kind_of(t.name) is not ShardingType.DATA_PARALLEL
        ]
        if stored and is_narrow(self.table_dtype):
            mark = RoundedTables(
                self.prefix, id(self), self.world_size, self.table_dtype.name, tuple(stored)
            )
            for var in self.local_variables():
                mark_rounded_tables(var, mark)

    def storage_dtype(self, table: str):
        """The dtype ``table``'s variables hold (replicated tables: the block's)."""
        if self.plan.kind_of(table) is ShardingType.DATA_PARALLEL:
            return self.dtype
        return self.table_dtype

    @abc.abstractmethod
    def create_variables(self, layer, initializer: Callable, trainable: bool) -> None:
        """Creates this rank's variables (called once, by :meth:`build`)."""

    @abc.abstractmethod
    def local_variables(self) -> list:
        """Variables whose contents differ by rank (never allreduced or broadcast)."""

    @abc.abstractmethod
    def shard_variable(self, shard: Shard):
        """``(variable, first row)`` where this rank stores ``shard`` (one of its own)."""

    def sublayers(self) -> list:
        """Keras layers the backend owns; the block tracks them so their weights are its own."""
        return []

    # ---- one step ----------------------------------------------------------------------------

    def call(
        self,
        inputs: list,
        training: bool = False,
        problems=(),
        following=None,
        waiting=None,
        key_updates=None,
    ) -> list:
        """Ordered list of ``(ids, row_lengths)`` -> ordered list of outputs.

        ``problems``: messages about this rank's inputs found before this call (a missing or
        malformed feature, replaced by a placeholder); they fail every rank after the header
        exchange, as bad ids do. ``following``: ``(next inputs, their problems)``, the next
        batch of a training step (empty after the last), or None. ``waiting``: the training
        step's list where the exchanges' backward waits for the optimizer
        (``backends/step.py``), or None. ``key_updates``: what a training call
        does to the dynamic tables' key maps (:class:`..step.KeyUpdates`), or None.
        """
        batch = batch_size(inputs)
        if self.out_of_range is not None:
            self.out_of_range.assign_add(ids_outside(inputs, self.features, self.tables))
        if following is not None and self.supports_ahead and self.world_size > 1:
            return self.step_ahead(
                inputs, batch, problems, following, training, waiting, key_updates
            )
        header, check = self.header_and_check(inputs, batch, problems)
        return self.exchange_and_lookup(
            inputs, batch, header, check, training, waiting, key_updates
        )

    def step_ahead(
        self, inputs: list, batch, problems, following, training: bool, waiting, key_updates
    ) -> list:
        """A training step that also sends the next batch's ids (``supports_ahead``)."""
        raise NotImplementedError(f"backend {self.name!r} exchanges ids inside the step only")

    supports_ahead: ClassVar[bool] = False  # can a step exchange the next batch's ids?

    def id_message(self, inputs: list, header):
        """The first exchange's message: ``(flat, splits)``, to each rank the header then the
        ids it serves (backends whose ``supports_ahead`` is True)."""
        raise NotImplementedError(f"backend {self.name!r} exchanges ids inside the step only")

    def send_ids(self, inputs: list, header, name: str):
        """The first exchange alone: ``(received, received_splits)``."""
        flat, splits = self.id_message(inputs, header)
        return comm.alltoall(flat, splits, name=name)

    def local_problem_checks(self, inputs, batch, problems=()):
        """(problem count, deferred checks) of this rank's ``inputs`` (see ``validate``)."""
        return local_problems(
            inputs,
            self.features,
            self.tables,
            batch,
            problems,
            check_ids=self.validate_ids,
            require_samples=self.world_size > 1,
        )

    def header_and_check(self, inputs, batch, problems):
        """(header, check): this rank's ``[batch size, problem count]`` and the checks to run
        on every rank's header once the first exchange delivered them."""
        problems, deferred = self.local_problem_checks(inputs, batch, problems)

        def check(received, received_splits):
            return check_headers(
                received, received_splits, batch, self.rank, self.world_size, deferred
            )

        return tf.stack([batch, problems]), check

    @abc.abstractmethod
    def exchange_and_lookup(
        self,
        inputs: list,
        batch,
        header,
        check: Callable,
        training: bool,
        waiting=None,
        key_updates=None,
    ) -> list:
        """The backend's own stages. ``header`` must reach every rank in the first exchange;
        ``check(received, received_splits)`` gives the assertions that must run before any
        lookup (``received`` holds, per source rank, a segment starting with the header).
        ``waiting``, ``key_updates``: see :meth:`call`."""

    def exchange_header(self, header, check: Callable) -> list:
        """For backends whose own first exchange cannot carry the header: one allgather."""
        n = self.world_size
        received = agree.gather_header(tf.unstack(header), self.collective_name("header"), n)
        return check(tf.reshape(received, [-1]), tf.fill([n], 2))

    def collective_name(self, stage: str) -> str:
        """Collective names: the same on every rank, unique per layer and stage."""
        return f"{self.prefix}_{stage}"

    # ---- the training step's hooks (called through ``backends/step.py``) ---------------------

    @classmethod
    def input_pipeline(cls, model, dataset):
        """``fit``'s input for this backend's blocks in ``model``: ``dataset`` as it is
        (a backend that sends the next batch's ids ahead pairs each batch with them)."""
        del model
        return dataset

    @classmethod
    def complete_backward(cls, entries, grads, variables, local, name: str):
        """``(grads, averaged)`` when the optimizer has the gradients of ``variables``
        (``local[i]``: a local variable): ``entries`` are what this backend's exchanges added
        to the step's :class:`~merlin_models_de.backends.step.Waiting`. A backend that defers
        nothing: ``grads`` as given, none averaged."""
        del entries, variables, local, name
        return list(grads), [False] * len(grads)

    # ---- whole tables ------------------------------------------------------------------------

    def get_table(self, name: str, chunk_bytes: int):
        """Collective: the full table as a NumPy array on every rank (moved in chunks)."""
        shards = self.plan.shards_of(name)
        if shards[0].kind is ShardingType.DATA_PARALLEL:
            return self.shard_variable(shards[0])[0].numpy()  # every rank has the whole table
        table = self.plan.table(name)
        dtype = self.storage_dtype(name)
        out = np.zeros((table.rows, table.dim), dtype.as_numpy_dtype)
        for s in shards:
            for lo, hi in _chunks(s.rows, s.cols * dtype.size, chunk_bytes):
                if s.rank == self.rank:
                    var, first = self.shard_variable(s)
                    data = var[first + lo : first + hi]
                else:
                    data = tf.zeros([hi - lo, s.cols], dtype)
                data = comm.broadcast(data, root_rank=s.rank)
                out[s.row_start + lo : s.row_start + hi, s.col_start : s.col_start + s.cols] = data
        return out

    def set_table(self, name: str, array, root_rank, chunk_bytes: int) -> None:
        """Collective: writes the full table ``array`` into the owners' shards."""
        table = self.plan.table(name)
        if array is not None and tuple(np.shape(array)) != (table.rows, table.dim):
            raise ValueError(
                f"Table '{name}' has shape {(table.rows, table.dim)}. "
                f"Received: shape={tuple(np.shape(array))}"
            )
        shards = self.plan.shards_of(name)
        dtype = self.storage_dtype(name)
        for s in shards:
            for lo, hi in _chunks(s.rows, s.cols * dtype.size, chunk_bytes):
                if array is not None:
                    data = np.asarray(
                        array[
                            s.row_start + lo : s.row_start + hi, s.col_start : s.col_start + s.cols
                        ],
                        dtype.as_numpy_dtype,
                    )
                else:
                    data = np.zeros((hi - lo, s.cols), dtype.as_numpy_dtype)
                if root_rank is not None:
                    data = comm.broadcast(tf.constant(data), root_rank=root_rank)
                if s.rank == self.rank:
                    var, first = self.shard_variable(s)
                    var[first + lo : first + hi].assign(data)


def _chunks(rows, row_bytes, chunk_bytes):
    step = max(1, chunk_bytes // max(1, row_bytes))
    return [(lo, min(rows, lo + step)) for lo in range(0, rows, step)]
