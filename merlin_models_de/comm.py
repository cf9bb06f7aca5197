"""Collectives: with :mod:`merlin_models_de.compat`, the only
module that imports Horovod (this one uses its public API only).

Nothing here runs at import time: Horovod is imported and initialized on first use, and
only when the process was started by ``horovodrun`` (or Horovod was already initialized).
A plain single process is world size 1 and every collective is the identity.

Example:
    >>> from merlin_models_de import comm
    >>> comm.size(), comm.rank()  # doctest: +SKIP
    (1, 0)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import sys

from merlin_models_de.launchers import check_launch, launcher


class _LazyTF:
    """``tf`` imported on first use, so importing this module never loads TensorFlow."""

    def __getattr__(self, attr):
        return getattr(importlib.import_module("tensorflow"), attr)


tf = _LazyTF()

# inside single_process(): this context acts as world size 1 (a context variable, so the
# override belongs to the code inside the ``with`` and ends with it)
_SINGLE: contextvars.ContextVar[bool] = contextvars.ContextVar("mmde_single_process", default=False)


@contextlib.contextmanager
def single_process():
    """Context manager: inside it this process acts as world size 1 (no collectives).

    Used to build a plain single-process copy of a model, e.g. to export it for serving.

    Example:
        >>> with single_process():
        ...     size()
        1
    """
    token = _SINGLE.set(True)
    try:
        yield
    finally:
        _SINGLE.reset(token)


def overridden() -> bool:
    """True inside :func:`single_process`."""
    return _SINGLE.get()


def _launched() -> bool:
    return launcher() is not None


def hvd(defaults=None):
    """The ``horovod.tensorflow`` module, initialized; None in a plain single process.

    ``defaults``: Horovod's environment variables (name -> value) to start it with where it
    starts here and the user has not set them; Horovod reads them once, at its start.
    """
    if _SINGLE.get():
        return None
    if not _launched():
        try:
            import horovod.tensorflow as h
        except ImportError:
            return None
        return h if h.is_initialized() else None
    import horovod.tensorflow as h

    if not h.is_initialized():
        for name, value in (defaults or {}).items():
            os.environ.setdefault(name, value)
        _start()
    _announce_launch(h)
    return h


@functools.cache  # once a process (an error is not cached: every later call raises it again)
def _announce_launch(horovod) -> None:
    """Checks the launch against the Horovod that runs (whoever initialized it: Merlin's import
    does) and says in one line, on rank 0, how this job was launched."""
    started = check_launch(horovod)
    if horovod.rank() == 0:
        print(started, file=sys.stderr, flush=True)


@functools.cache  # once a process: the threads started are Horovod's for the process's life
def _start() -> tuple[int, ...]:
    """Initializes Horovod here; the OS ids of the threads its init started (it returns once
    its loop and transport threads run)."""
    import horovod.tensorflow as h

    before = _thread_ids()
    h.init()
    return tuple(sorted(_thread_ids() - before))


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # no /proc: nothing to name
        return set()


def horovod_threads() -> tuple[int, ...]:
    """OS ids of the threads Horovod started in this process (its coordination loop and its
    transport's), known where :func:`hvd` initialized Horovod on Linux; empty otherwise."""
    started_here = _start.cache_info().currsize > 0  # never start Horovod from here
    return _start() if started_here else ()


def size() -> int:
    """Number of ranks (1 without horovodrun)."""
    h = hvd()
    return h.size() if h else 1


def rank() -> int:
    """This process's rank (0 without horovodrun)."""
    h = hvd()
    return h.rank() if h else 0


def local_rank() -> int:
    """Rank on this host (0 without horovodrun)."""
    h = hvd()
    return h.local_rank() if h else 0


def local_size() -> int:
    """Ranks on this host (1 without horovodrun)."""
    h = hvd()
    return h.local_size() if h else 1


def alltoall(tensor, splits, name=None):
    """Sends ``tensor[rows of split i]`` to rank i; returns (received, received_splits).

    Differentiable: the gradient is the reverse all-to-all. With ``name`` both directions
    use fixed names (``name`` and ``name + "_grad"``, no name scope): in graph mode Horovod
    pairs ops across ranks by name, and ranks whose graphs differ (they hold different
    shards) would otherwise derive different names and wait for each other forever.
    """
    h = hvd()
    if h is None or h.size() == 1:
        return tensor, splits
    if name is None and tensor.dtype != tf.bfloat16:
        return h.alltoall(tensor, splits=splits)
    received_splits = []

    @tf.custom_gradient
    def exchange(x):
        out, rsplits = move(x, splits, name)
        received_splits.append(rsplits)

        def grad(dy):
            back, _ = move(dy, rsplits, name and name + "_grad")
            return back

        return out, grad

    out = exchange(tensor)
    return out, received_splits[0]


def move(tensor, splits, name=None):
    """:func:`alltoall` without a gradient: ``(received, received_splits)``."""
    h = hvd()
    if h is None or h.size() == 1:
        return tensor, splits
    # Horovod's all-to-all has no bfloat16; it only moves bytes, so move the bits
    if tensor.dtype != tf.bfloat16:
        return h.alltoall(tensor, splits=splits, name=name, ignore_name_scope=bool(name))
    out, rsplits = h.alltoall(
        tf.bitcast(tensor, tf.uint16), splits=splits, name=name, ignore_name_scope=bool(name)
    )
    return tf.bitcast(out, tf.bfloat16), rsplits


def allgather(tensor, name=None):
    """Concatenates every rank's ``tensor`` along axis 0 (rank order). Not differentiated."""
    h = hvd()
    if h is None or h.size() == 1:
        return tensor
    return h.allgather(tensor, name=name, ignore_name_scope=name is not None)


def allreduce(tensor, op="average", name=None):
    """Average (default) or sum of ``tensor`` over ranks. A ``name`` is Horovod's name as
    given, as in :func:`allgather` and :func:`alltoall`: a name scope numbered within one
    rank's graph (a Keras metric's ``tf.cond`` branch) would keep ranks whose graphs differ
    from pairing the collective."""
    h = hvd()
    if h is None or h.size() == 1:
        return tensor
    reduce_op = h.Average if op == "average" else h.Sum
    return h.allreduce(tensor, op=reduce_op, name=name, ignore_name_scope=name is not None)


def average_gradients(grads, prefix="mmde_grad") -> list:
    """Every gradient averaged over ranks, in one grouped allreduce per dtype (Horovod's grouped
    op takes a single dtype), named ``<prefix>_<dtype>`` on every rank alike. ``None`` stays
    ``None``; ``IndexedSlices`` are averaged dense (the only global ones are data-parallel
    tables, small by definition). The identity on one rank.

    One group instead of Horovod's default (an allreduce per gradient, each behind its own
    ``tf.cond``): one negotiation per step, and far less to trace.
    """
    h = hvd()
    if h is None or h.size() == 1:
        return list(grads)
    out = [None if g is None else tf.convert_to_tensor(g) for g in grads]
    by_dtype: dict = {}
    for i, g in enumerate(out):
        if g is not None:
            by_dtype.setdefault(g.dtype.name, []).append(i)
    for dtype in sorted(by_dtype):
        positions = by_dtype[dtype]
        averaged = h.grouped_allreduce(
            [out[i] for i in positions],
            op=h.Average,
            name=f"{prefix}_{dtype}",
            ignore_name_scope=True,
        )
        for i, value in zip(positions, averaged):
            out[i] = value
    return out


def after(x, *previous):
    """``x`` plus a zero computed from ``previous`` (a data dependency).

    Horovod's graph collectives are not stateful: TF prunes one whose output nobody reads
    (a rank holding 0 rows reads no gathered data) and may start independent ones in any
    order. Feeding every collective a zero derived from the previous one's output makes
    every rank run every collective, in one order. ``min(size, 0)`` of a tensor whose size
    is only known at run time cannot be folded away.
    """
    zero = tf.add_n([tf.minimum(tf.size(p, out_type=tf.int64), 0) for p in previous])
    return x + tf.cast(zero, x.dtype)


def broadcast(tensor, root_rank=0, name=None):
    """``root_rank``'s ``tensor`` on every rank."""
    h = hvd()
    if h is None or h.size() == 1:
        return tensor
    tensor = tf.convert_to_tensor(tensor)
    if tensor.dtype == tf.bfloat16:  # Horovod 0.28 has no bfloat16: send the bits
        bits = h.broadcast(tf.bitcast(tensor, tf.int16), root_rank, name=name)
        return tf.bitcast(bits, tf.bfloat16)
    return h.broadcast(tensor, root_rank, name=name)


def allgather_object(obj, name=None) -> list:
    """Every rank's picklable ``obj``, as a list in rank order."""
    h = hvd()
    if h is None or h.size() == 1:
        return [obj]
    return h.allgather_object(obj, name=name)


def broadcast_object(obj, root_rank=0, name=None):
    """``root_rank``'s picklable ``obj`` on every rank."""
    h = hvd()
    if h is None or h.size() == 1:
        return obj
    return h.broadcast_object(obj, root_rank, name=name)


def barrier(name="mmde_barrier") -> None:
    """Waits until every rank arrives (Horovod's TF API has no barrier; a tiny allreduce is one)."""
    h = hvd()
    if h is not None and h.size() > 1:
        h.allreduce(tf.constant(0, tf.int32), op=h.Sum, name=name)


def broadcast_variables(variables, root_rank=0) -> None:
    """Assigns ``root_rank``'s values to ``variables`` on every rank (no-op on one rank)."""
    h = hvd()
    if h is not None and h.size() > 1 and variables:
        h.broadcast_variables(list(variables), root_rank=root_rank)
