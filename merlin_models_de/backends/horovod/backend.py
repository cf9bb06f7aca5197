"""The built-in backend: plain TensorFlow ops and Horovod all-to-all / allgather.

One step, N ranks, B samples per rank:

1. input exchange: every rank sends each owner the ids of the features it serves (plus a
   two-number header: batch size and count of bad ids, so every rank sees every rank's), or
   a training step starts from the ids the step before sent ahead (:mod:`.ahead`);
2. local lookup: the owner gathers from its shards;
3. output exchange: the owner sends each rank the vectors of that rank's samples (and, in a
   training step, the next batch's ids ride along where the schedule says so).

Gradients flow back through the same all-to-alls (Horovod registers their gradients), or,
in a training step, wait for the optimizer and go with the dense average (:mod:`.backward`).
Which collective carries what, and when, is the plan's :class:`.schedule.StepSchedule`;
:class:`.pipeline.StepPipeline` runs each call by it, one stage after the other.

Example:
    >>> backend = HorovodBackend(plan, features, rank=0)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from merlin_models_de.backends.base import EmbeddingBackend
from merlin_models_de.backends.horovod import ahead, backward
from merlin_models_de.backends.horovod.pipeline import StepContext, StepPipeline
from merlin_models_de.backends.horovod.schedule import StepSchedule
from merlin_models_de.backends.horovod.table_lookup import lookup_ids
from merlin_models_de.backends.shard_init import (
    drawn_wide,
    fill_by_rows,
    for_shard,
    row_blocks,
)
from merlin_models_de.dynamic.keymap import KeyMap
from merlin_models_de.planner.routing import Routing
from merlin_models_de.planner.types import MODEL_PARALLEL, ShardingPlan, ShardingType
from merlin_models_de.variables import mark_column_sync


class HorovodBackend(EmbeddingBackend):
    """Executes every plan the planner makes (see the module docstring)."""

    name = "horovod"

    def __init__(self, plan: ShardingPlan, features, rank: int, **options):
        super().__init__(plan, features, rank, **options)  # options: see the base class
        self.routing = Routing.build(plan, self.features)
        self.schedule = StepSchedule.build(self.routing, self.features)
        self.pipeline = StepPipeline(self)  # runs each call by the schedule
        # the next batch's kept exchange (several ranks), by build()
        self.lookahead: ahead.Lookahead | None = None
        self.mp: dict = {}  # table -> this rank's model-parallel shard (table or column slice)
        self.dp: dict = {}  # table -> replicated variable
        self.rw: dict = {}  # table -> this rank's row slice
        # dynamic tables: table -> this rank's key map, the replicated default row, and the
        # initializer new rows are drawn like (merlin_models_de.dynamic)
        self.keymaps: dict = {}
        self.defaults: dict = {}
        self.initializers: dict = {}
        self.anchor: Any = None  # see create_variables (a variable)

    # ---- variables --------------------------------------------------------------------------

    def create_variables(self, layer, initializer, trainable: bool | Callable[[str], bool]) -> None:
        """Creates this rank's variables.

        One variable per shard, not one per width: TF's CPU scatter (the sparse update of
        every optimizer step) takes a slow locked path above a few thousand rows per call, and
        separate variables keep each update small (measured: SGD step 2.8 ms -> 1.1 ms on
        Criteo's 26 tables); initialization also needs no concatenated copy.
        """

        def trains(table: str) -> bool:  # one flag, or one per table
            return trainable(table) if callable(trainable) else trainable

        base_seed, shared_seed = self.init_seeds

        def drawn_like_table(shard, shape):  # its own seed, the whole table's variance
            spec = self.plan.table(shard.table)
            return for_shard(
                initializer(shard.table),
                (spec.rows, spec.dim),
                shape,
                start=(shard.row_start, shard.col_start),
                table=shard.table,
                base_seed=base_seed,
                shared_seed=shared_seed,
            )

        def add_shard(name, shard, shape):
            initializer = drawn_like_table(shard, shape)
            # on several ranks, a large shard is drawn a block of rows at a time, in place
            dtype = self.table_dtype
            blocks = row_blocks(initializer, shape, dtype) if base_seed is not None else None
            var = layer.add_weight(
                name=name,
                shape=shape,
                dtype=dtype,
                initializer="zeros" if blocks else drawn_wide(initializer),
                trainable=trains(shard.table),
            )
            if blocks:
                fill_by_rows(var, blocks)
            return var

        for s in self.plan.shards_on(self.rank):
            table = self.plan.table(s.table)
            if s.kind in MODEL_PARALLEL:
                suffix = f"_c{s.col_start}" if s.cols != table.dim else ""
                self.mp[s.table] = add_shard(f"mp_{s.table}{suffix}", s, (s.rows, s.cols))
            elif s.kind is ShardingType.DATA_PARALLEL:
                self.dp[s.table] = layer.add_weight(
                    name=f"dp_{s.table}",
                    shape=(table.rows, table.dim),
                    initializer=initializer(s.table),
                    trainable=trains(s.table),
                )
            elif table.dynamic is not None:  # rows are drawn from their keys when given
                self.rw[s.table] = layer.add_weight(
                    name=f"rw_{s.table}",
                    shape=(s.rows, table.dim),
                    dtype=self.table_dtype,
                    initializer="zeros",
                    trainable=trains(s.table),
                )
                # eager even when Keras builds the block inside fit's traced step: a hash
                # table made in a graph would be made afresh at every step
                with tf.init_scope():
                    keymap = KeyMap(s.rows, table.dynamic, f"{self.prefix}_{s.table}")
                self.keymaps[s.table] = keymap
                self.defaults[s.table] = layer.add_weight(
                    name=f"default_{s.table}",
                    shape=(1, table.dim),
                    initializer=initializer(s.table),
                    trainable=trains(s.table),
                )
                self.initializers[s.table] = initializer(s.table)
            else:
                self.rw[s.table] = add_shard(f"rw_{s.table}", s, (s.rows, table.dim))

        # A rank that sends nothing in an exchange would send a constant, which no gradient
        # tape records; that rank would then skip the exchange's backward all-to-all that
        # the others run (a hang). Empty sends read this zero scalar, so every rank records
        # every exchange. Every output also reads it (as an exact 0), so its gradient is
        # always 0 and exists on every rank; it is local, so never allreduced.
        if self.keymaps:  # tracked by the block: its SavedModel holds the maps it reads
            layer.dynamic_keymaps = self.keymaps
        self.anchor = layer.add_weight(
            name="exchange_anchor", shape=(), initializer="zeros", trainable=True
        )
        # the same on every rank: the collective that keeps row-wise optimizer state of
        # column-sliced tables whole runs on every rank, slice or not (rowwise/columns.py)
        sliced = tuple(
            t.name
            for t in self.plan.tables
            if any(s.cols != t.dim for s in self.plan.shards_of(t.name))
        )
        mark_column_sync(self.anchor, self.prefix, sliced, id(self))
        if self.world_size > 1:
            self.lookahead = ahead.Lookahead(self.world_size)

    def empty_send(self):
        """A watched empty send (see ``anchor``).

        The anchor is broadcast into the empty tensor, not multiplied by 0: Grappler rewrites
        ``x * 0`` to a constant, which left the backward all-to-all's result unread, so graph
        mode pruned that collective on this rank alone (a hang in Keras fit). The sum of an
        empty gradient is still 0.
        """
        return tf.zeros([0], self.dtype) + tf.cast(self.anchor, self.dtype)

    def local_variables(self) -> list:
        anchor = [self.anchor] if self.anchor is not None else []
        return list(self.mp.values()) + list(self.rw.values()) + anchor

    # ---- one step -----------------------------------------------------------------------------

    def exchange_and_lookup(
        self, inputs, batch, header, check, training=False, waiting=None, key_updates=None
    ) -> list:
        """A call that exchanges its own ids first, run by the schedule (:mod:`.pipeline`)."""
        ctx = StepContext(inputs, batch, training, waiting, key_updates, header, check)
        return self.pipeline.run(ctx, ahead=False)

    def step_ahead(
        self, inputs, batch, problems, following, training, waiting, key_updates
    ) -> list:
        """A training step that sends the next batch's ids (:mod:`.ahead`), run by the
        schedule (:mod:`.pipeline`): in the rows' forward exchange, or alone where the
        schedule has none."""
        if self.lookahead is None:  # build() makes it on several ranks, the only ones ahead
            raise RuntimeError(f"{self.name}: a step ahead needs several ranks and a built block")
        ctx = StepContext(
            inputs, batch, training, waiting, key_updates, problems=problems, following=following
        )
        return self.pipeline.run(ctx, ahead=True)

    def anchor_zero(self):
        """An exact 0 that reads the anchor (see ``empty_send``), in the block's dtype."""
        return tf.reduce_sum(self.empty_send())

    supports_ahead = True

    @classmethod
    def input_pipeline(cls, model, dataset):
        """Each batch paired with the next one's ids (:func:`.ahead.pipelined`); a new
        ``fit`` starts from no kept ids."""
        ahead.forget(model)
        return ahead.pipelined(model, dataset)

    @classmethod
    def complete_backward(cls, entries, grads, variables, local, name: str):
        """The rows' waiting backward and the dense average in one all-to-all
        (:func:`.backward.complete`)."""
        return backward.complete(entries, grads, variables, local, name)

    def id_message(self, inputs, header):
        """The first all-to-all's message: to each owner, the header then the ids of the
        one-hot lookups it serves and the row lengths of its multi-hot ones."""
        r, n = self.routing, self.routing.world_size
        segments = []
        for owner in range(n):
            lookups = r.served[owner]
            seg = [header] + [inputs[l.feature][0] for l in lookups if not l.multi_hot]
            seg += [inputs[l.feature][1] for l in lookups if l.multi_hot]
            segments.append(tf.concat(seg, axis=0))
        splits = tf.stack([tf.size(s, out_type=tf.int32) for s in segments])
        return tf.concat(segments, 0), splits

    def pooled_shards(self) -> list:
        """This rank's trainable shards that pooled lookups read (their rows' backward may
        wait for the optimizer: see :mod:`.backward`)."""
        found = {}
        for lk in self.routing.served[self.rank]:
            var = self.mp[lk.shard.table]
            if not lk.sequence and var.trainable:
                found[var.ref()] = var
        return list(found.values())

    # ---- one table, arbitrary ids -------------------------------------------------------------

    def lookup_table(self, table: str, ids, problems=()):
        """Collective: ``[n, dim]`` rows of ``table`` for this rank's flat ``ids`` (``n`` may
        differ by rank); differentiable; bad ids fail every rank (see :mod:`.table_lookup`)."""
        if table in self.keymaps:
            raise NotImplementedError(
                f"Table '{table}' is dynamic: its rows are found by key in the block's own "
                "lookup, not by row id (a tied or vocab-parallel output over it, or a table "
                f"handle's lookup). Received: table={table!r}"
            )
        return lookup_ids(self, table, ids, problems)

    # ---- whole tables -------------------------------------------------------------------------

    def shard_variable(self, shard):
        """(variable, first row) of ``shard`` on its owner."""
        if shard.kind is ShardingType.DATA_PARALLEL:
            return self.dp[shard.table], 0
        if shard.kind is ShardingType.ROW_WISE:
            return self.rw[shard.table], 0
        return self.mp[shard.table], 0
