"""The rows' backward exchange, merged with the dense gradients' average into one all-to-all.

A training step on several ranks ends with two rounds in a row: the all-to-all that sends
each looked-up row's gradient back to the rank that owns the row, then the allreduce of the
replicated (dense) gradients. Both carry gradients of the same backward pass, so they can
travel together: each rank sends each owner its rows' gradients followed by its whole dense
gradient, and sums the N dense gradients it receives. On 2 ranks that moves the bytes of a
ring allreduce; above, ``(N-1)(N-2)/N`` dense gradients more per rank, so the dense part
joins only while that extra stays under :data:`MAX_EXTRA_BYTES` (the rows always go).

How: while the optimizer computes the gradients (:func:`collecting`), the rows' exchange
(:func:`exchange`) keeps the gradient that reaches it instead of sending it back and gives
the tape none for its input; the optimizer then calls :func:`complete`, which runs the one
all-to-all, averages the dense gradients, and takes each table's gradient from a tape that
recorded only this rank's lookup (:func:`recording`). Anywhere else (a custom loop calling
``tape.gradient``) the exchange sends its gradient back at once, as a plain all-to-all does.
Every rank makes the same choice: the same model, the same optimizer, the same sizes.

The rows' forward exchange may also carry a payload without gradient (the next batch's ids,
``lookahead.py``): one collective fewer per step.

Example:
    >>> with recording(shards, enabled=True) as recorded:  # doctest: +SKIP
    ...     received, splits, _ = exchange(rows, splits, "vectors", recorded)
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import tensorflow as tf

from merlin_models_de import comm

# extra dense bytes per rank the merged round may send beyond a ring allreduce's
MAX_EXTRA_BYTES = 4 << 20

_state = threading.local()  # .collectors: a stack, the innermost gradient computation last


@dataclass
class _Pending:
    """One exchange whose backward waits for :func:`complete`."""

    dy: tf.Tensor  # the gradient of what this rank received, in received order
    back_splits: tf.Tensor  # what this rank received from each rank: what goes back
    sent_splits: tf.Tensor  # what this rank sent each rank: what comes back
    sent: tf.Tensor  # the exchange's input, recorded by ``tape`` from ``sources``
    tape: tf.GradientTape
    sources: list
    name: str


def _collectors() -> list:
    if not hasattr(_state, "collectors"):
        _state.collectors = []
    return _state.collectors


@contextlib.contextmanager
def collecting():
    """Exchanges whose gradient is computed inside wait for :func:`complete` (called inside)."""
    stack = _collectors()
    stack.append([])
    try:
        yield
    finally:
        stack.pop()


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


def exchange(tensor, splits, name: str, recorded, carried=None):
    """:func:`comm.alltoall` whose backward is deferred while gradients are collected, when
    ``recorded`` (from :func:`recording`) is given: ``(received, received_splits, arrived)``.

    ``carried``: ``(payload, payload_splits, tensor_splits_in)``, an int64 payload that travels
    after each rank's part of ``tensor`` in the same all-to-all, without gradient;
    ``tensor_splits_in`` (how much of ``tensor`` each rank sends this one, known to both
    sides) tells the received payload apart, and is the ``received_splits`` returned.
    ``arrived``: ``(payload received, its splits)``, or None without ``carried``."""
    if recorded is None and carried is None:
        return (*comm.alltoall(tensor, splits, name=name), None)
    received_splits, arrived = [], []

    @tf.custom_gradient
    def run(x):
        if carried is None:
            out, rsplits = comm.move(x, splits, name)
        else:
            out, rsplits, got = _move_carrying(x, splits, *carried, name)
            arrived.append(got)
        received_splits.append(rsplits)

        def grad(dy):
            stack = _collectors()
            if recorded is None or not stack:
                back, _ = comm.move(dy, rsplits, name + "_grad")
                return back
            stack[-1].append(_Pending(tf.convert_to_tensor(dy), rsplits, splits, tensor,
                                      *recorded, name))
            return None  # the tables' gradients come from complete()

        return out, grad

    return run(tensor), received_splits[0], (arrived[0] if arrived else None)


def _move_carrying(x, splits, payload, payload_splits, splits_in, name):
    """:func:`comm.move` of ``x`` with ``payload`` (int64) after each rank's part, as units of
    ``x``'s dtype: ``(x received, splits_in, (payload received, its splits))``."""
    n = comm.size()
    ratio = payload.dtype.size // x.dtype.size
    units_splits = tf.cast(payload_splits, tf.int32) * ratio
    parts = tf.split(x, splits, num=n)
    carried = tf.split(_units(payload, x.dtype), units_splits, num=n)
    send = tf.concat([t for j in range(n) for t in (parts[j], carried[j])], 0)
    received, total = comm.move(send, tf.cast(splits, tf.int32) + units_splits, name)
    splits_in = tf.cast(splits_in, tf.int32)
    carried_in = total - splits_in
    pieces = tf.split(received, tf.reshape(tf.stack([splits_in, carried_in], 1), [-1]),
                      num=2 * n)
    got = _from_units(tf.concat(pieces[1::2], 0), payload.dtype)
    return tf.concat(pieces[0::2], 0), splits_in, (got, carried_in // ratio)


def extra_bytes(world: int, dense_bytes: int) -> float:
    """Bytes per rank the merged round sends beyond a ring allreduce of ``dense_bytes``
    (``(N-1)`` copies against ``2(N-1)/N``).

    Example:
        >>> extra_bytes(2, 1000), extra_bytes(4, 1000)
        (0.0, 1500.0)
    """
    return (world - 1) * dense_bytes - 2 * (world - 1) / world * dense_bytes


def complete(grads, variables, local, name: str = "mmde_merged"):
    """``(grads, averaged)``: the collected exchanges' backward run as one all-to-all, each
    table's gradient added to ``grads``, and the float32 global gradients averaged in the
    same round where :func:`extra_bytes` allows (``averaged[i]`` True for those: the
    allreduce skips them). Nothing collected: ``grads`` as given."""
    grads, n = list(grads), comm.size()
    averaged = [False] * len(grads)
    stack = _collectors()
    entries = stack[-1] if stack else []
    if not entries:
        return grads, averaged
    dense = [i for i, (g, v) in enumerate(zip(grads, variables))
             if g is not None and not local[i] and g.dtype == tf.float32
             and v.shape.is_fully_defined()]
    sizes = [variables[i].shape.num_elements() for i in dense]
    if extra_bytes(n, 4 * sum(sizes)) > MAX_EXTRA_BYTES:
        dense, sizes = [], []
    unit = tf.float32 if all(e.dy.dtype == tf.float32 for e in entries) else tf.uint16
    flat = (tf.concat([tf.reshape(tf.convert_to_tensor(grads[i]), [-1]) for i in dense], 0)
            if dense else tf.zeros([0], tf.float32))
    dense_units = sum(sizes) * (4 // unit.size)
    ratios = [e.dy.dtype.size // unit.size for e in entries]

    # to each owner: every exchange's rows for it, then the whole dense gradient
    parts = [tf.split(_units(e.dy, unit), e.back_splits * r, num=n)
             for e, r in zip(entries, ratios)]
    dense_sent = _units(flat, unit)
    send = tf.concat([p for o in range(n) for p in [k[o] for k in parts] + [dense_sent]], 0)
    send_splits = tf.add_n([tf.cast(e.back_splits, tf.int32) * r
                            for e, r in zip(entries, ratios)]) + dense_units
    received, _ = comm.move(send, send_splits, name)
    # from each rank: every exchange's rows this rank owns, then that rank's dense gradient
    per_rank = [tf.cast(e.sent_splits, tf.int32) * r for e, r in zip(entries, ratios)]
    layout = tf.reshape(tf.stack(per_rank + [tf.fill([n], dense_units)], axis=1), [-1])
    pieces = tf.split(received, layout, num=n * (len(entries) + 1))
    stride = len(entries) + 1

    position = {v.ref(): i for i, v in enumerate(variables)}
    for k, e in enumerate(entries):
        back = _from_units(tf.concat([pieces[r * stride + k] for r in range(n)], 0), e.dy.dtype)
        if not e.sources:
            continue  # this rank's shards are frozen: its rows' gradients are not needed
        table_grads = e.tape.gradient(e.sent, e.sources,
                                      output_gradients=tf.reshape(back, tf.shape(e.sent)))
        for var, g in zip(e.sources, table_grads):
            i = position.get(var.ref())
            if i is not None and g is not None:
                grads[i] = _added(grads[i], g)
    if dense:
        total = tf.add_n([_from_units(pieces[r * stride + stride - 1], tf.float32)
                          for r in range(n)]) / n
        for i, part in zip(dense, tf.split(total, sizes)):
            grads[i] = tf.reshape(part, variables[i].shape)
            averaged[i] = True
    return grads, averaged


def _units(x, unit):
    """``x`` flat, as ``unit`` elements (bit for bit; ``unit`` no wider than ``x``'s)."""
    x = tf.reshape(x, [-1])
    return x if x.dtype == unit else tf.reshape(tf.bitcast(x, unit), [-1])


def _from_units(x, dtype):
    """The inverse of :func:`_units`."""
    if x.dtype == dtype:
        return x
    if dtype.size == x.dtype.size:
        return tf.bitcast(x, dtype)
    return tf.bitcast(tf.reshape(x, [-1, dtype.size // x.dtype.size]), dtype)


def _added(a, b):
    """The sum of two gradients of one variable (sparse ones stay sparse)."""
    if a is None:
        return b
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    if isinstance(b, tf.IndexedSlices):
        a, b = b, a
    if isinstance(a, tf.IndexedSlices):
        return tf.tensor_scatter_nd_add(b, tf.expand_dims(a.indices, 1), a.values)
    return a + b
