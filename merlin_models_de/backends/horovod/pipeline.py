"""One call of the built-in backend, run by its schedule: one stage function per kind.

:class:`StepPipeline` walks the stages :meth:`.schedule.StepSchedule.for_call` gives for the
call (a training step that sends the next batch's ids, or one that exchanges its own first)
and calls ``STAGES[stage.kind]`` for each, in order. A stage reads what earlier stages made
from the call's :class:`StepContext` and writes what it makes there; the pipeline owns the
context for the duration of the call (the way TorchRec's train pipeline hands its context
from stage to stage). No stage decides whether a collective runs: the schedule did, when it
listed the stage. The stages:

- ``ids`` / ``kept_or_ids``: the first all-to-all (the header every rank checks, one-hot ids,
  multi-hot row lengths), or what the step before kept (:mod:`.ahead`);
- ``next_ids``: the next batch's id message, which this step sends;
- ``unpack``: each served lookup's ids from every rank; ``values``: multi-hot ids;
- ``lookup``: this rank's gathers; ``vectors``: pooled rows back to the askers (carrying the
  next batch's ids when the step has them); ``sequences``: un-pooled rows back;
- ``row_sliced``: one feature's row-sliced (or dynamic) table: ids to every rank, rows back;
- ``ids_next``: the next batch's ids alone (a plan without pooled rows);
- ``assemble``: the block's outputs, in feature order; ``keep``: what arrived, for the next
  step.

Example:
    >>> outputs = StepPipeline(backend).run(StepContext(inputs, batch), ahead=False)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.horovod import ahead, backward
from merlin_models_de.backends.horovod.dynamic_exchange import dynamic_lookup
from merlin_models_de.backends.horovod.exchange import row_sliced_lookup
from merlin_models_de.backends.horovod.wire import from_wire, to_wire
from merlin_models_de.backends.lookup import named_gather, op_name, pooled_lookup
from merlin_models_de.backends.step import KeyUpdates
from merlin_models_de.backends.validate import batch_size
from merlin_models_de.dynamic.reset import row_reset, warn_unreset_state
from merlin_models_de.planner.types import MODEL_PARALLEL, ShardingType


@dataclass
class StepContext:
    """One call's values, handed from stage to stage (see the module docstring)."""

    inputs: list  # per feature (ids, row lengths or None)
    batch: Any  # this rank's batch size (a scalar tensor)
    training: bool = False
    waiting: Any = None  # the step's ``Waiting`` (the rows' backward waits in it), or None
    key_updates: KeyUpdates | None = None  # what the call does to dynamic tables' key maps
    header: Any = None  # a plain call: this rank's [batch, problems]
    check: Callable | None = None  # a plain call: the header checks, given the ids' exchange
    problems: Any = ()  # a step ahead: this rank's problems found before the call
    following: Any = None  # a step ahead: (the next batch's inputs, their problems)
    # made by the stages, in order
    first: Any = None  # (received, splits) of the ids' exchange
    checked: list = field(default_factory=list)  # its checks: every later op waits for them
    sent: ahead.NextIds | None = None  # the next batch's id message
    after: Any = None  # an int32 0 known only once the ids arrived (see ``unpack``)
    body: Any = None  # [N, lookups served, B] of the ids' exchange
    per_lookup: list = field(default_factory=list)  # per served lookup (ids, lengths)
    vectors: list = field(default_factory=list)  # per served lookup, this rank's gathers
    recorded: Any = None  # the tape of this rank's lookup (backward.recording), or None
    from_owner: list = field(default_factory=list)  # per owner {served index: rows}
    arrived: Any = None  # (received, splits) of the next batch's ids
    row_sliced: dict = field(default_factory=dict)  # feature index -> its rows
    outputs: list = field(default_factory=list)  # per feature, the block's output
    scope: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    tape_scope: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


class StepPipeline:
    """Runs one call of ``backend`` (a built :class:`.backend.HorovodBackend`) by its schedule."""

    def __init__(self, backend):
        self.backend = backend

    def run(self, ctx: StepContext, ahead: bool) -> list:
        """The block's outputs of ``ctx``'s call; ``ahead``: a training step that sends the
        next batch's ids (``ctx.following``)."""
        with ctx.scope:
            try:
                for stage in self.backend.schedule.for_call(ahead):
                    STAGES[stage.kind](self.backend, ctx, stage)
            finally:
                ctx.tape_scope.close()
        return ctx.outputs


# ---- the stages ------------------------------------------------------------------------------


def _ids(b, ctx, stage):
    """The ids' exchange, checked on every rank; every later op waits for the checks."""
    ctx.first = b.send_ids(ctx.inputs, ctx.header, b.collective_name("ids"))
    ctx.checked = ctx.check(*ctx.first)
    ctx.scope.enter_context(tf.control_dependencies(ctx.checked))


def _kept_or_ids(b, ctx, stage):
    """This step's ids: kept by the step before (checked from its headers), or exchanged now
    when nothing was kept; every rank takes the same branch (:class:`.ahead.Lookahead`)."""

    def now():
        header, check = b.header_and_check(ctx.inputs, ctx.batch, ctx.problems)
        received, splits = b.send_ids(ctx.inputs, header, b.collective_name("ids"))
        with tf.control_dependencies(check(received, splits)):
            return tf.identity(received), tf.identity(splits)

    ctx.first = b.lookahead.kept_or(now, ctx.batch, b.rank, b.world_size)


def _next_ids(b, ctx, stage):
    """The next batch's id message (:class:`.ahead.NextIds`). It waits for this step's ids
    (a data dependency): a step whose batch fails its checks fails on every rank before any
    rank sends, so no rank is left with a half-run collective that the next one would meet.

    Every step sends, also after the last batch (an empty one): ranks whose data ends at
    different steps (``steps_per_epoch`` below one rank's batches) still run the same
    collectives."""
    inputs, problems = ctx.following
    received = ctx.first[0]
    b.lookahead.traced_steps += 1
    batch = batch_size(inputs)
    count, deferred = b.local_problem_checks(inputs, batch, problems)
    header = comm.after(tf.stack([batch, count]), received)
    payload, splits = b.id_message(inputs, header)
    ok, message = ahead.first_problem(deferred)
    ctx.sent = ahead.NextIds(payload, splits, ok, message, received)


def _unpack(b, ctx, stage):
    """Each one-hot lookup this rank serves: its ids from every rank; ``after``: an int32
    zero computed from the ids' exchange.

    Every later exchange adds ``after`` to its splits (or ids). Horovod's ops are not marked
    stateful, so in graph mode Grappler's constant folding *runs* a collective whose inputs
    are all constants (an empty send with fixed splits: a rank that serves no pooled, or no
    un-pooled, lookup) while optimizing the graph, on that rank alone, and every rank hangs.
    A data dependency on this exchange's result keeps every later collective out of reach of
    the folding (control dependencies do not)."""
    r, n = b.routing, b.routing.world_size
    received, received_splits = ctx.first
    # 0, but only known once the exchange ran (Grappler folds tf.size of its output)
    ctx.after = tf.minimum(tf.reduce_min(tf.cast(received_splits, tf.int32)), 0)
    n_oh, n_mh = r.counts(b.rank)
    if not n_oh + n_mh:  # this rank serves no pooled lookup: its segments are headers
        ctx.body = tf.zeros([n, 0, 0], received.dtype)  # no lengths, for ``values``
        return
    # -1, not the batch size: a shape computed from the inputs makes TF's shape inference
    # try to evaluate it when Keras saves the model ("Executor start aborting" in the log)
    body = tf.reshape(received, [n, -1])[:, 2:]
    ctx.body = tf.reshape(body, [n, n_oh + n_mh, -1])
    # each one-hot lookup's ids from every rank: one transpose, not a slice each
    if n_oh:
        one_hot = tf.reshape(tf.transpose(ctx.body[:, :n_oh, :], [1, 0, 2]), [n_oh, -1])
        ctx.per_lookup = [(ids, None) for ids in tf.unstack(one_hot, num=n_oh)]


def _values(b, ctx, stage):
    """The ids of multi-hot lookups (every rank joins when any rank serves one)."""
    r, n = b.routing, b.routing.world_size
    values, value_splits = [], []
    for owner in range(n):
        vals = [ctx.inputs[lk.feature][0] for lk in r.served[owner] if lk.multi_hot]
        values += vals
        value_splits.append(
            sum(tf.size(v, out_type=tf.int64) for v in vals) if vals else tf.constant(0, tf.int64)
        )
    n_oh, n_mh = r.counts(b.rank)
    sent = tf.concat(values, 0) if values else tf.zeros([0], tf.int64)
    received, _ = comm.alltoall(
        sent,
        tf.cast(tf.stack(value_splits), tf.int32) + ctx.after,
        name=b.collective_name("values"),
    )
    lengths = ctx.body[:, n_oh:, :]
    rows = tf.RaggedTensor.from_row_lengths(received, tf.reshape(lengths, [-1]))
    for m in range(n_mh):
        pick = tf.reshape(
            tf.range(n, dtype=tf.int64)[:, None] * n_mh * ctx.batch
            + m * ctx.batch
            + tf.range(ctx.batch)[None, :],
            [-1],
        )
        picked = tf.gather(rows, pick)
        ctx.per_lookup.append((picked.values, picked.row_lengths()))


def _lookup(b, ctx, stage):
    """This rank's gathers: per served lookup ``[N*B, cols]`` (pooled) or, un-pooled,
    ``([ids of all ranks, cols], ids per source rank)``. A training step's pooled rows are
    recorded for a backward that waits for the optimizer (:func:`.backward.recording`)."""
    n = b.routing.world_size
    ctx.recorded = ctx.tape_scope.enter_context(
        backward.recording(b.pooled_shards(), ctx.training and ctx.waiting is not None)
    )
    ctx.from_owner = [{} for _ in range(n)]
    for k, lk in enumerate(b.routing.served[b.rank]):
        ids, lengths = ctx.per_lookup[k]
        var = b.mp[lk.shard.table]
        feature = b.features[lk.feature]
        # the op name reaches TF's out-of-range error (validate_ids=False, CPU)
        name = op_name(f"lookup_{feature.name}_in_table_{lk.shard.table}")
        if lk.sequence:
            per_rank = tf.reduce_sum(tf.reshape(lengths, [n, -1]), axis=1)
            rows = named_gather(var, ids, name, b.dtype)
            ctx.vectors.append((rows, tf.cast(per_rank, tf.int32)))
        elif lk.multi_hot:
            ctx.vectors.append(
                pooled_lookup(
                    var,
                    ids,
                    row_lengths=lengths,
                    combiner=feature.combiner,
                    name=name,
                    dtype=b.dtype,
                )
            )
        else:
            ctx.vectors.append(named_gather(var, ids, name, b.dtype))


def _vectors(b, ctx, stage):
    """Pooled rows to the ranks that asked: per owner ``{served index: [B, cols]}``, carrying
    the next batch's ids when the step sends them (``ctx.sent``).

    Each owner's message to a rank is lookup-major (all of lookup 0's ``[B, cols]``, then
    lookup 1's, ...) and travels as blocks (:func:`.backward.exchange`): column splits of a
    ``[B, sum(cols)]`` matrix cost a copy per row (measured 2.8 ms a step on Criteo), and a
    joined buffer costs a copy more on each side in each direction."""
    r, n = b.routing, b.routing.world_size
    size = tf.cast(ctx.batch, tf.int32)
    pooled = [v for v, lk in zip(ctx.vectors, r.served[b.rank]) if not lk.sequence]
    # each [N*B, cols] in rank-major rows: rank j's block is the j-th of N equal parts
    parts = [tf.split(tf.reshape(to_wire(v, b.exchange_dtype), [-1]), n) for v in pooled]
    # the anchor's empty block: the send is recorded also where the shards are frozen
    anchor = to_wire(b.empty_send(), b.exchange_dtype)
    blocks = [[p[j] for p in parts] + [anchor] for j in range(n)]

    # the widths of the blocks each owner sends each rank, with the anchor's
    widths = [[lk.shard.cols for lk in r.served[j] if not lk.sequence] + [0] for j in range(n)]
    incoming = [size * tf.constant(w, tf.int32) + ctx.after for w in widths]
    payload = None if ctx.sent is None else (ctx.sent.payload, ctx.sent.splits)
    received, ctx.arrived = backward.exchange(
        blocks,
        [incoming[b.rank]] * n,
        incoming,
        b.collective_name("vectors"),
        ctx.recorded,
        payload,
        ctx.waiting,
        type(b),
        widths,
    )
    ctx.tape_scope.close()  # the recorded lookup ends with the rows' exchange
    # the anchor, read once (by the first block) for every pooled output (see ``assemble``)
    zero = b.anchor_zero()
    for j in range(n):
        served = [(k, lk.shard.cols) for k, lk in enumerate(r.served[j]) if not lk.sequence]
        for (k, cols), block in zip(served, received[j]):
            block = from_wire(block, b.dtype)
            if zero is not None:
                block, zero = block + zero, None
            ctx.from_owner[j][k] = tf.reshape(block, [-1, cols])


def _sequences(b, ctx, stage):
    """Un-pooled rows: each owner sends every rank one row per id it sent; sizes vary by rank
    and step, and both sides know them (the ids per rank)."""
    r, n = b.routing, b.routing.world_size
    mine = [(ctx.vectors[k], lk.shard.cols) for k, lk in r.sequences(b.rank)]
    per_dest: list = [[] for _ in range(n)]
    splits = tf.zeros([n], tf.int32)
    for (rows, per_rank), cols in mine:
        for j, block in enumerate(tf.split(rows, per_rank, num=n)):
            per_dest[j].append(tf.reshape(block, [-1]))
        splits += per_rank * cols
    flat = tf.concat([t for dest in per_dest for t in dest], 0) if mine else b.empty_send()
    received, _ = comm.alltoall(
        to_wire(flat, b.exchange_dtype), splits + ctx.after, name=b.collective_name("sequences")
    )
    received = from_wire(received, b.dtype)
    sizes = {}  # (owner, served index) -> flat size of my rows
    for j in range(n):
        for k, lk in r.sequences(j):
            count = tf.size(ctx.inputs[lk.feature][0], out_type=tf.int32)
            sizes[(j, k)] = (count * lk.shard.cols, lk.shard.cols)
    pieces = tf.split(received, [size for size, _ in sizes.values()]) if sizes else []
    for ((j, k), (_, cols)), piece in zip(sizes.items(), pieces):
        ctx.from_owner[j][k] = tf.reshape(piece, [-1, cols])


def _row_sliced(b, ctx, stage):
    """One feature's row-sliced table: every rank's ids to every rank, rows back, summed
    (:func:`.exchange.row_sliced_lookup`); a dynamic table's owner is its key's
    (:func:`.dynamic_exchange.dynamic_lookup`)."""
    feature = b.features[stage.feature]
    ids, lengths = ctx.inputs[stage.feature]
    # after the ids' exchange (see ``unpack``)
    ids = ids + tf.cast(ctx.after, ids.dtype)
    if feature.multi_hot and lengths is not None:
        lengths = lengths + tf.cast(ctx.after, lengths.dtype)
    else:
        lengths = None
    name = b.collective_name(f"rw_{feature.name}")
    var = b.rw[feature.table]
    if feature.table in b.keymaps:
        updates = ctx.key_updates or KeyUpdates()
        if ctx.training and updates.optimizer_state is None:
            warn_unreset_state(feature.table)
        rows = dynamic_lookup(
            var,
            b.defaults[feature.table],
            b.keymaps[feature.table],
            ids,
            name,
            training=ctx.training and feature.name not in updates.placeholders,
            reset=row_reset(
                var, b.initializers[feature.table], feature.table, updates.optimizer_state
            ),
            lengths=lengths,
            combiner=feature.combiner,
            dtype=b.dtype,
        )
    else:
        shard = next(s for s in b.plan.shards_on(b.rank) if s.table == feature.table)
        rows = row_sliced_lookup(
            var, shard, ids, name, lengths=lengths, combiner=feature.combiner, dtype=b.dtype
        )
    ctx.row_sliced[stage.feature] = rows


def _ids_next(b, ctx, stage):
    """The next batch's ids in an all-to-all of their own (no rows' exchange carries them)."""
    ctx.arrived = comm.alltoall(
        ctx.sent.payload, ctx.sent.splits, name=b.collective_name("ids_next")
    )


def _assemble(b, ctx, stage):
    """The block's outputs, in feature order: each feature's pieces (rows from their owners,
    a replicated table's local lookup, a row-sliced table's rows) side by side.

    Every output reads the anchor (adding an exact 0), so it has a gradient (0) on every rank,
    also where no send is empty; otherwise Keras warns at each fit that "Gradients do not
    exist for variables ['exchange_anchor']". Pooled rows read it once, in the rows' exchange
    (one op, not one per output and one in its gradient)."""
    r = b.routing
    outputs, anchored = [], []
    for i, f in enumerate(b.features):
        parts = []
        anchored.append(
            all(
                p.kind in MODEL_PARALLEL and not r.served[p.owner][p.index].sequence
                for p in r.pieces[i]
            )
        )
        for p in r.pieces[i]:
            if p.kind in MODEL_PARALLEL:
                parts.append(ctx.from_owner[p.owner][p.index])
            elif p.kind is ShardingType.DATA_PARALLEL:
                ids, lengths = ctx.inputs[i]
                parts.append(
                    pooled_lookup(
                        b.dp[p.table],
                        ids,
                        combiner=f.combiner,
                        row_lengths=lengths if f.combiner else None,
                    )
                )
            else:
                parts.append(ctx.row_sliced[i])
        outputs.append(parts[0] if len(parts) == 1 else tf.concat(parts, axis=1))
    zero = b.anchor_zero() if not all(anchored) else None  # read once per call
    ctx.outputs = [
        out if done else out + tf.cast(zero, out.dtype) for out, done in zip(outputs, anchored)
    ]


def _keep(b, ctx, stage):
    """What arrived of the next batch's ids, kept for the next step (:class:`.ahead.Lookahead`)."""
    b.lookahead.keep(ctx.sent, *ctx.arrived)


STAGES: dict[str, Callable] = {
    "ids": _ids,
    "kept_or_ids": _kept_or_ids,
    "next_ids": _next_ids,
    "unpack": _unpack,
    "values": _values,
    "lookup": _lookup,
    "vectors": _vectors,
    "sequences": _sequences,
    "row_sliced": _row_sliced,
    "ids_next": _ids_next,
    "assemble": _assemble,
    "keep": _keep,
}
