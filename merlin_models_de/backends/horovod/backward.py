"""The rows' backward exchange, merged with the dense gradients' average into one all-to-all.

A training step on several ranks ends with two rounds in a row: the all-to-all that sends
each looked-up row's gradient back to the rank that owns the row, then the allreduce of the
replicated (dense) gradients. Both carry gradients of the same backward pass, so they can
travel together: each rank sends each owner its rows' gradients followed by its whole dense
gradient, and sums the N dense gradients it receives. On 2 ranks that moves the bytes of a
ring allreduce; above, ``(N-1)(N-2)/N`` dense gradients more per rank, so the dense part
joins only while that extra stays under :data:`MAX_EXTRA_BYTES` (the rows always go).

How: the rows' exchange (:func:`exchange`) of a training step gets the step's ``waiting``
list (``backends/step.py``) as an argument; when the optimizer computes the gradients, its
backward keeps the gradient that reaches it in that list instead of sending it back, and gives
the tape none for its input (:meth:`.backend.HorovodBackend.complete_backward` is who
completes it: the exchange adds it with its backend class). The optimizer's hook then calls
:func:`complete` through that backend, which runs the one
all-to-all, averages the dense gradients, and takes each table's gradient from a tape that
recorded only this rank's lookup (:func:`recording`). Anywhere else (evaluate, a custom loop
calling ``tape.gradient``: no waiting list) the exchange sends its gradient back at once, as
a plain all-to-all does. Every rank makes the same choice: the same model, the same
optimizer, the same sizes.

The rows' forward exchange may also carry a payload without gradient (the next batch's ids,
``ahead.py``): one collective fewer per step.

Example:
    >>> with recording(shards, enabled=True) as recorded:  # doctest: +SKIP
    ...     received, _ = exchange([[rows_to_0], [rows_to_1]], sizes, incoming, "vectors",
    ...                            recorded, waiting=step.waiting)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.horovod.wire import from_units, units

# extra dense bytes per rank the merged round may send beyond a ring allreduce's
MAX_EXTRA_BYTES = 4 << 20


@dataclass
class _Pending:
    """One exchange whose backward waits for :func:`complete`."""

    dys: list  # per source rank, the gradients of the blocks received from it
    back_splits: tf.Tensor  # what this rank received from each rank: what goes back
    sizes: list  # per destination rank, the sizes of the blocks sent to it: what comes back
    sent: list  # the blocks sent (destination-major), recorded by ``tape`` from ``sources``
    tape: tf.GradientTape
    sources: list
    name: str


@contextlib.contextmanager
def recording(sources, enabled: bool):
    """``(tape, sources)`` recording this rank's lookup from ``sources`` (its trainable
    shards) for a deferred backward, or None when not ``enabled`` (not training, one rank,
    the option off). Enabled on every rank alike, also where ``sources`` is empty."""
    if not enabled or comm.size() == 1:
        yield None
        return
    sources = list(sources)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(sources)
        yield tape, sources


def exchange(
    blocks,
    sizes,
    incoming,
    name: str,
    recorded,
    carried=None,
    waiting=None,
    backend=None,
    widths=None,
):
    """The rows' all-to-all, block by block: ``(received blocks, arrived)``; its backward is
    deferred while gradients are collected, when ``recorded`` (from :func:`recording`) is given.

    Blocks, not one tensor, so that no side copies the rows more than once: the owner's
    gathered rows go into the send buffer in one concat, each received block is a view of the
    received buffer (when its size keeps it aligned), and in the backward each block's gradient
    goes to its own lookup without being joined and split again (measured on Criteo, rank 0:
    the column split of the joined gradient alone took 2.6 ms a step in TF's profiler).

    Args:
        blocks: Per destination rank, the 1-D tensors this rank sends it, in order (one dtype).
        sizes: Per destination rank, an int32 vector: the sizes of those blocks.
        incoming: Per source rank, an int32 vector of static length: the sizes of the blocks
            it sends this rank (known to both sides).
        carried: ``(payload, payload_splits)``: an int64 payload sent after each destination's
            blocks in the rows' units, without gradient (its sizes per destination).
        waiting: The training step's ``Waiting`` (``backends/step.py``), where the backward
            waits for :func:`complete` (with ``recorded``), or None: the backward is a plain
            all-to-all.
        backend: The backend class that completes what waits (its ``complete_backward``).
        widths: Per source rank, the static widths of its blocks when each is a flat
            ``[this rank's samples, width]`` (``incoming`` is then samples times these).
            With them and nothing carried, the received buffer is cut by static sizes: TF's
            shape inference tries to evaluate sizes computed from the inputs when Keras
            saves the model, and logs "Executor start aborting" for each try.

    Returns:
        Per source rank the list of its blocks, and ``arrived``: ``(payload received, its
        splits)``, or None without ``carried``.
    """
    n = len(blocks)
    flat = [b for dest in blocks for b in dest]
    totals = tf.stack([tf.reduce_sum(s) for s in sizes])
    totals_in = tf.stack([tf.reduce_sum(s) for s in incoming])
    counts = [int(s.shape[0]) for s in incoming]
    arrived, arrived_splits = [], []

    @tf.custom_gradient
    def run(*sent):
        pieces, splits = [], totals
        if carried is None:
            per_dest = [[] for _ in range(n)]
        else:
            payload, payload_splits = carried
            ratio = payload.dtype.size // sent[0].dtype.size
            units_splits = tf.cast(payload_splits, tf.int32) * ratio
            per_dest = [[p] for p in tf.split(units(payload, sent[0].dtype), units_splits, num=n)]
            splits = totals + units_splits
        start = 0
        for j, dest in enumerate(blocks):
            pieces += list(sent[start : start + len(dest)]) + per_dest[j]
            start += len(dest)
        received, received_splits = comm.move(tf.concat(pieces, 0), splits, name)
        layout = list(incoming)
        if carried is not None:  # after each source's blocks, what remains is its payload
            carried_in = received_splits - totals_in
            arrived_splits.append(carried_in // ratio)  # in the payload's own units
            layout = [t for j in range(n) for t in (incoming[j], carried_in[j : j + 1])]
        if carried is None and widths is not None:
            parts = _cut_by_widths(received, [w for source in widths for w in source])
        else:
            parts = tf.split(
                received, tf.concat(layout, 0), num=sum(counts) + n * (carried is not None)
            )
        if carried is not None:  # each source's payload is the last of its group
            grouped = _grouped(parts, [c + 1 for c in counts])
            rows = [g[:-1] for g in grouped]
            arrived.extend(g[-1] for g in grouped)
        else:
            rows = _grouped(parts, counts)

        def grad(*dys):
            dys = [
                tf.zeros_like(r) if d is None else d
                for r, d in zip([r for source in rows for r in source], dys)
            ]
            if recorded is None or waiting is None:
                back, _ = comm.move(
                    tf.concat(dys, 0) if dys else tf.zeros([0], sent[0].dtype),
                    totals_in,
                    name + "_grad",
                )
                return tf.split(back, tf.concat(sizes, 0), num=len(sent))
            waiting.add(
                backend,
                _Pending(
                    _grouped(dys, counts), totals_in, list(sizes), list(sent), *recorded, name
                ),
            )
            return [None] * len(sent)  # the tables' gradients come from complete()

        return [r for source in rows for r in source], grad

    out = _grouped(run(*flat), counts)
    if carried is None:
        return out, None
    return out, (from_units(tf.concat(arrived, 0), carried[0].dtype), arrived_splits[0])


def _cut_by_widths(received, widths) -> list:
    """``received``, flat blocks of ``[samples, width]`` (one sample count) in order, cut into
    its blocks: viewed as ``[sum(widths), samples]``, block k is ``widths[k]`` rows of it."""
    total = sum(widths)
    if not total:  # nothing but empty blocks arrived
        return [received[:0] for _ in widths]
    rows = tf.split(tf.reshape(received, [total, -1]), widths, axis=0)
    return [tf.reshape(r, [-1]) for r in rows]


def _grouped(items, counts) -> list:
    """``items`` cut into consecutive lists of ``counts[i]`` items."""
    out, at = [], 0
    for count in counts:
        out.append(list(items[at : at + count]))
        at += count
    return out


def extra_bytes(world: int, dense_bytes: int) -> float:
    """Bytes per rank the merged round sends beyond a ring allreduce of ``dense_bytes``
    (``(N-1)`` copies against ``2(N-1)/N``).

    Example:
        >>> extra_bytes(2, 1000), extra_bytes(4, 1000)
        (0.0, 1500.0)
    """
    return (world - 1) * dense_bytes - 2 * (world - 1) / world * dense_bytes


def complete(entries, grads, variables, local, name: str = "mmde_merged"):
    """``(grads, averaged)``: the backward of the exchanges ``entries`` (taken from the step's
    ``Waiting``) run as one all-to-all, each table's gradient added to ``grads``, and the
    float32 global gradients averaged in the same round where :func:`extra_bytes` allows
    (``averaged[i]`` True for those: the allreduce skips them). No entries: ``grads`` as
    given."""
    grads, n = list(grads), comm.size()
    averaged = [False] * len(grads)
    if not entries:
        return grads, averaged
    dense = [
        i
        for i, (g, v) in enumerate(zip(grads, variables))
        if g is not None and not local[i] and g.dtype == tf.float32 and v.shape.is_fully_defined()
    ]
    sizes = [variables[i].shape.num_elements() for i in dense]
    if extra_bytes(n, 4 * sum(sizes)) > MAX_EXTRA_BYTES:
        dense, sizes = [], []
    unit = tf.float32 if all(e.sent[0].dtype == tf.float32 for e in entries) else tf.uint16
    flat = (
        tf.concat([tf.reshape(tf.convert_to_tensor(grads[i]), [-1]) for i in dense], 0)
        if dense
        else tf.zeros([0], tf.float32)
    )
    dense_units = sum(sizes) * (4 // unit.size)
    # padded to 64 bytes, so that the next rank's rows start aligned and the received buffer
    # splits into views instead of copies
    padded = -(-dense_units * unit.size // 64) * 64 // unit.size
    dense_sent = units(flat, unit)
    if padded > dense_units:
        dense_sent = tf.concat([dense_sent, tf.zeros([padded - dense_units], unit)], 0)
    ratios = [e.sent[0].dtype.size // unit.size for e in entries]

    # to each owner: every exchange's blocks from it, then the whole dense gradient
    pieces = []
    for o in range(n):
        pieces += [units(d, unit) for e in entries for d in e.dys[o]] + [dense_sent]
    send_splits = (
        tf.add_n([tf.cast(e.back_splits, tf.int32) * r for e, r in zip(entries, ratios)]) + padded
    )
    received, _ = comm.move(tf.concat(pieces, 0), send_splits, name)
    # from each rank: every exchange's blocks sent to it, then that rank's dense gradient
    layout = []
    for o in range(n):
        layout += [tf.cast(e.sizes[o], tf.int32) * r for e, r in zip(entries, ratios)]
        layout.append(tf.constant([padded], tf.int32))
    count = sum(int(e.sizes[o].shape[0]) for o in range(n) for e in entries) + n
    parts = iter(tf.split(received, tf.concat(layout, 0), num=count))
    back: list[list] = [[] for _ in entries]
    dense_in = []
    for o in range(n):
        for k, e in enumerate(entries):
            back[k] += [next(parts) for _ in range(int(e.sizes[o].shape[0]))]
        dense_in.append(next(parts))

    position = {v.ref(): i for i, v in enumerate(variables)}
    for e, blocks in zip(entries, back):
        if not e.sources:
            continue  # this rank's shards are frozen: its rows' gradients are not needed
        dtype = e.sent[0].dtype
        table_grads = e.tape.gradient(
            e.sent, e.sources, output_gradients=[from_units(b, dtype) for b in blocks]
        )
        for var, g in zip(e.sources, table_grads):
            i = position.get(var.ref())
            if i is not None and g is not None:
                grads[i] = _added(grads[i], g)
    if dense:
        # summed with their padding (zeros), which the split then drops: slicing each
        # received part first would copy every one of them
        total = tf.add_n([from_units(d, tf.float32) for d in dense_in]) / n
        pad = (padded - dense_units) * unit.size // 4  # floats, 0 when already aligned
        for i, part in zip(dense, tf.split(total, sizes + [pad])):
            grads[i] = tf.reshape(part, variables[i].shape)
            averaged[i] = True
    return grads, averaged


def _added(a, b):
    """The sum of two gradients of one variable (sparse ones stay sparse)."""
    if a is None:
        return b
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape
        )
    if isinstance(b, tf.IndexedSlices):
        a, b = b, a
    if isinstance(a, tf.IndexedSlices):
        return tf.tensor_scatter_nd_add(b, tf.expand_dims(a.indices, 1), a.values)
    return a + b
