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
Which collective carries what, and when, is the plan's :class:`.schedule.StepSchedule`.

Example:
    >>> backend = HorovodBackend(plan, features, rank=0)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.base import EmbeddingBackend
from merlin_models_de.backends.horovod import ahead, backward
from merlin_models_de.backends.horovod.dynamic_exchange import dynamic_lookup
from merlin_models_de.backends.horovod.exchange import row_sliced_lookup
from merlin_models_de.backends.horovod.schedule import StepSchedule
from merlin_models_de.backends.horovod.table_lookup import lookup_ids
from merlin_models_de.backends.horovod.wire import from_wire, to_wire
from merlin_models_de.backends.lookup import named_gather, op_name, pooled_lookup
from merlin_models_de.backends.shard_init import (
    drawn_wide,
    fill_by_rows,
    for_shard,
    row_blocks,
)
from merlin_models_de.backends.step import KeyUpdates
from merlin_models_de.dynamic.keymap import KeyMap
from merlin_models_de.dynamic.reset import row_reset, warn_unreset_state
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
            self.lookahead = ahead.Lookahead(self)

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
        """The three stages, the ids exchanged first (see the module docstring)."""
        received, splits = self.send_ids(inputs, header, self.collective_name("ids"))
        checked = check(received, splits)
        outputs, _ = self._stages(
            inputs, batch, (received, splits), checked, training, waiting, None, key_updates
        )
        return outputs

    def step_ahead(
        self, inputs, batch, problems, following, training, waiting, key_updates
    ) -> list:
        """A training step that sends the next batch's ids (:mod:`.ahead`): in the rows'
        forward exchange, or alone where the schedule has none."""
        lookahead = self.lookahead
        if lookahead is None:  # build() makes it on several ranks, the only ones that step ahead
            raise RuntimeError(f"{self.name}: a step ahead needs several ranks and a built block")
        first = lookahead.this_step(inputs, batch, problems)  # kept, or exchanged now
        next_inputs, next_problems = following
        sent = lookahead.message(next_inputs, next_problems, after=first)
        carried = sent if self.schedule.next_ids_ride else None
        outputs, arrived = self._stages(
            inputs, batch, first, [], training, waiting, carried, key_updates
        )
        if not self.schedule.next_ids_ride:
            arrived = lookahead.send_alone(sent)
        lookahead.keep(sent, *arrived)
        return outputs

    def _stages(
        self, inputs, batch, first, checked, training, waiting, carried=None, key_updates=None
    ):
        """``(outputs, arrived)``: stages 1b-3 from the id exchange's result ``first``
        (``(received, splits)``, its checks ``checked``); ``arrived``: what came of
        ``carried`` (the next batch's :class:`.ahead.NextIds`), or None. Un-pooled
        (sequence) features come back as ``[ids, dim]`` rows in the order of their flat ids
        (the block restores the ragged / padded shape)."""
        r, n = self.routing, self.routing.world_size
        ids_by_lookup, after = self._input_exchange(inputs, batch, first, checked)
        with tf.control_dependencies(checked):
            with backward.recording(
                self._pooled_shards(), training and waiting is not None
            ) as recorded:
                vectors = self._local_lookup(ids_by_lookup)
                from_owner, arrived = self._output_exchange(
                    vectors, batch, after, recorded, carried, waiting
                )
            if any(r.sequences(j) for j in range(n)):
                self._sequence_exchange(vectors, inputs, from_owner, after)
            outputs, anchored = [], []
            for i, f in enumerate(self.features):
                parts = []
                # pooled rows came through the rows' exchange, which read the anchor
                anchored.append(
                    all(
                        p.kind in MODEL_PARALLEL and not r.served[p.owner][p.index].sequence
                        for p in r.pieces[i]
                    )
                )
                for p in r.pieces[i]:
                    if p.kind in MODEL_PARALLEL:
                        parts.append(from_owner[p.owner][p.index])
                    elif p.kind is ShardingType.DATA_PARALLEL:
                        ids, lengths = inputs[i]
                        parts.append(
                            pooled_lookup(
                                self.dp[p.table],
                                ids,
                                combiner=f.combiner,
                                row_lengths=lengths if f.combiner else None,
                            )
                        )
                    else:
                        parts.append(self._row_sliced(inputs[i], f, after, training, key_updates))
                outputs.append(parts[0] if len(parts) == 1 else tf.concat(parts, axis=1))
        # Every output reads the anchor (adding an exact 0), so it has a gradient (0) on every
        # rank, also where no send is empty; otherwise Keras warns at each fit that
        # "Gradients do not exist for variables ['exchange_anchor']". Pooled rows read it
        # once, in the rows' exchange (one op, not one per output and one in its gradient).
        zero = self.anchor_zero() if not all(anchored) else None  # read once per call
        return [
            out if done else out + tf.cast(zero, out.dtype) for out, done in zip(outputs, anchored)
        ], arrived

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

    def _input_exchange(self, inputs, batch, first, checked):
        """Stage 1b, from the id exchange's result ``first`` (``(received, splits)``, its
        checks ``checked``). Returns per served lookup its ids from all ranks, and ``after``:
        an int32 zero computed from the id exchange's result.

        Every later exchange adds ``after`` to its splits (or ids). Horovod's ops are not
        marked stateful, so in graph mode Grappler's constant folding *runs* a collective whose
        inputs are all constants (an empty send with fixed splits: a rank that serves no
        pooled, or no un-pooled, lookup) while optimizing the graph, on that rank alone, and
        every rank hangs. A data dependency on this exchange's result keeps every later
        collective out of reach of the folding (control dependencies do not).
        """
        r, n = self.routing, self.routing.world_size
        received, received_splits = first
        values, value_splits = [], []
        for owner in range(n):
            vals = [inputs[l.feature][0] for l in r.served[owner] if l.multi_hot]
            values += vals
            value_splits.append(
                sum(tf.size(v, out_type=tf.int64) for v in vals)
                if vals
                else tf.constant(0, tf.int64)
            )
        # 0, but only known once the exchange ran (Grappler folds tf.size of its output)
        after = tf.minimum(tf.reduce_min(tf.cast(received_splits, tf.int32)), 0)
        with tf.control_dependencies(checked):
            mine = r.served[self.rank]
            n_oh, n_mh = r.counts(self.rank)
            body = tf.reshape(received, [n, 2 + batch * (n_oh + n_mh)])[:, 2:]
            body = tf.reshape(body, [n, n_oh + n_mh, batch])
            # each one-hot lookup's ids from every rank: one transpose, not a slice each
            one_hot = tf.reshape(tf.transpose(body[:, :n_oh, :], [1, 0, 2]), [n_oh, -1])
            per_lookup = [(ids, None) for ids in tf.unstack(one_hot, num=n_oh)] if n_oh else []
            # every rank joins the values exchange when any rank serves a multi-hot lookup
            if any(r.counts(j)[1] for j in range(n)):
                per_lookup += self._multi_hot_exchange(
                    values, value_splits, body[:, n_oh:, :], batch, n_mh, after
                )
        return dict(zip(range(len(mine)), per_lookup)), after

    def _multi_hot_exchange(self, values, value_splits, lengths, batch, n_mh, after):
        """Stage 1b: the ids of multi-hot lookups; ``lengths`` is ``[N, n_mh, B]``."""
        n = self.routing.world_size
        sent = tf.concat(values, 0) if values else tf.zeros([0], tf.int64)
        received, _ = comm.alltoall(
            sent,
            tf.cast(tf.stack(value_splits), tf.int32) + after,
            name=self.collective_name("values"),
        )
        rows = tf.RaggedTensor.from_row_lengths(received, tf.reshape(lengths, [-1]))
        out = []
        for m in range(n_mh):
            pick = tf.reshape(
                tf.range(n, dtype=tf.int64)[:, None] * n_mh * batch
                + m * batch
                + tf.range(batch)[None, :],
                [-1],
            )
            picked = tf.gather(rows, pick)
            out.append((picked.values, picked.row_lengths()))
        return out

    def _local_lookup(self, ids_by_lookup):
        """Stage 2: per served lookup ``[N*B, cols]`` (pooled) or, un-pooled, ``([ids of all
        ranks, cols], ids per source rank)``, from this rank's shards."""
        out = []
        n = self.routing.world_size
        for k, l in enumerate(self.routing.served[self.rank]):
            ids, lengths = ids_by_lookup[k]
            var = self.mp[l.shard.table]
            feature = self.features[l.feature]
            # the op name reaches TF's out-of-range error (validate_ids=False, CPU)
            name = op_name(f"lookup_{feature.name}_in_table_{l.shard.table}")
            if l.sequence:
                per_rank = tf.reduce_sum(tf.reshape(lengths, [n, -1]), axis=1)
                rows = named_gather(var, ids, name, self.dtype)
                out.append((rows, tf.cast(per_rank, tf.int32)))
            elif l.multi_hot:
                out.append(
                    pooled_lookup(
                        var,
                        ids,
                        row_lengths=lengths,
                        combiner=feature.combiner,
                        name=name,
                        dtype=self.dtype,
                    )
                )
            else:
                out.append(named_gather(var, ids, name, self.dtype))
        return out

    def _pooled_shards(self) -> list:
        """This rank's trainable shards that pooled lookups read (their rows' backward may
        wait for the optimizer: see :mod:`.backward`)."""
        found = {}
        for l in self.routing.served[self.rank]:
            var = self.mp[l.shard.table]
            if not l.sequence and var.trainable:
                found[var.ref()] = var
        return list(found.values())

    def _output_exchange(self, vectors, batch, after, recorded, carried, waiting):
        """Stage 3: per owner, ``{served index: [B, cols]}`` for this rank's samples; carries
        ``carried`` (the next batch's :class:`.ahead.NextIds`) when given, and returns what
        arrived of it (or None); ``recorded`` and ``waiting``: see :func:`.backward.exchange`.

        Each owner's message to a rank is lookup-major (all of lookup 0's ``[B, cols]``, then
        lookup 1's, ...) and travels as blocks (:func:`.backward.exchange`): column splits of a
        ``[B, sum(cols)]`` matrix cost a copy per row (measured 2.8 ms a step on Criteo), and a
        joined buffer costs a copy more on each side in each direction.
        """
        r, n = self.routing, self.routing.world_size
        widths = [r.width(j) for j in range(n)]
        out = [{} for _ in range(n)]
        if not sum(widths):  # the schedule sends the next ids alone then
            return out, None
        b = tf.cast(batch, tf.int32)
        pooled = [v for v, l in zip(vectors, r.served[self.rank]) if not l.sequence]
        # each [N*B, cols] in rank-major rows: rank j's block is the j-th of N equal parts
        parts = [tf.split(tf.reshape(to_wire(v, self.exchange_dtype), [-1]), n) for v in pooled]
        # the anchor's empty block: the send is recorded also where the shards are frozen
        anchor = to_wire(self.empty_send(), self.exchange_dtype)
        blocks = [[p[j] for p in parts] + [anchor] for j in range(n)]

        def sizes(owner):  # the blocks ``owner`` sends each rank, with the anchor's
            cols = [l.shard.cols for l in r.served[owner] if not l.sequence] + [0]
            return b * tf.constant(cols, tf.int32) + after

        incoming = [sizes(j) for j in range(n)]
        payload = None if carried is None else (carried.payload, carried.splits)
        received, arrived = backward.exchange(
            blocks,
            [incoming[self.rank]] * n,
            incoming,
            self.collective_name("vectors"),
            recorded,
            payload,
            waiting,
            type(self),
        )
        # the anchor, read once (by the first block) for every pooled output: see
        # exchange_and_lookup
        zero = self.anchor_zero()
        for j in range(n):
            served = [(k, l.shard.cols) for k, l in enumerate(r.served[j]) if not l.sequence]
            for (k, cols), block in zip(served, received[j]):
                block = from_wire(block, self.dtype)
                if zero is not None:
                    block, zero = block + zero, None
                out[j][k] = tf.reshape(block, [-1, cols])
        return out, arrived

    def _sequence_exchange(self, vectors, inputs, out, after):
        """Stage 3b, un-pooled lookups: each owner sends every rank one row per id it sent;
        sizes vary by rank and step, and both sides know them (the ids per rank)."""
        r, n = self.routing, self.routing.world_size
        mine = [(vectors[k], l.shard.cols) for k, l in r.sequences(self.rank)]
        per_dest = [[] for _ in range(n)]
        splits = tf.zeros([n], tf.int32)
        for (rows, per_rank), cols in mine:
            for j, block in enumerate(tf.split(rows, per_rank, num=n)):
                per_dest[j].append(tf.reshape(block, [-1]))
            splits += per_rank * cols
        flat = tf.concat([t for dest in per_dest for t in dest], 0) if mine else self.empty_send()
        received, _ = comm.alltoall(
            to_wire(flat, self.exchange_dtype),
            splits + after,
            name=self.collective_name("sequences"),
        )
        received = from_wire(received, self.dtype)
        sizes = {}  # (owner, served index) -> flat size of my rows
        for j in range(n):
            for k, l in r.sequences(j):
                count = tf.size(inputs[l.feature][0], out_type=tf.int32)
                sizes[(j, k)] = (count * l.shard.cols, l.shard.cols)
        pieces = tf.split(received, [size for size, _ in sizes.values()]) if sizes else []
        for ((j, k), (_, cols)), piece in zip(sizes.items(), pieces):
            out[j][k] = tf.reshape(piece, [-1, cols])

    def _row_sliced(self, value, feature, after, training=False, key_updates=None):
        """A row-sliced table: every rank's ids to every rank, rows back, summed
        (:func:`.exchange.row_sliced_lookup`); a dynamic table's owner is its key's
        (:mod:`merlin_models_de.dynamic.lookup`)."""
        shard = next(s for s in self.plan.shards_on(self.rank) if s.table == feature.table)
        ids, lengths = value
        # after the input exchange (see _input_exchange)
        ids = ids + tf.cast(after, ids.dtype)
        lengths = (
            lengths + tf.cast(after, lengths.dtype)
            if feature.multi_hot and lengths is not None
            else None
        )
        if feature.table in self.keymaps:
            var = self.rw[feature.table]
            updates = key_updates or KeyUpdates()
            if training and updates.optimizer_state is None:
                warn_unreset_state(feature.table)
            return dynamic_lookup(
                var,
                self.defaults[feature.table],
                self.keymaps[feature.table],
                ids,
                self.collective_name(f"rw_{feature.name}"),
                training=training and feature.name not in updates.placeholders,
                reset=row_reset(
                    var, self.initializers[feature.table], feature.table, updates.optimizer_state
                ),
                lengths=lengths,
                combiner=feature.combiner,
                dtype=self.dtype,
            )
        return row_sliced_lookup(
            self.rw[feature.table],
            shard,
            ids,
            self.collective_name(f"rw_{feature.name}"),
            lengths=lengths,
            combiner=feature.combiner,
            dtype=self.dtype,
        )

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
