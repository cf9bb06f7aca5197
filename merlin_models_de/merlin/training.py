"""Training helpers for custom loops: gradient tapes and broadcasts that know which
variables are local (sharded tables), so those are never allreduced or broadcast.

Gradient convention: each rank's loss is a mean over its local batch. Dense (and
data-parallel table) gradients are averaged across ranks; a sharded table's gradient is the
sum of every rank's contribution divided by the world size. Both then equal the gradient one
process would get from the mean loss over the global batch.

Example:
    >>> with tf.GradientTape() as tape:  # doctest: +SKIP
    ...     loss = loss_fn(y, model(x, training=True))
    >>> tape = DistributedGradientTape(tape, model)  # doctest: +SKIP
    >>> grads = tape.gradient(loss, model.trainable_variables)  # doctest: +SKIP
    >>> optimizer.apply_gradients(zip(grads, model.trainable_variables))  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.compat.horovod import scaled_local_gradient
from merlin_models_de.variables import (
    is_local,
    local_variables,
    mark_optimizer_slots,
    slot,
    slot_names,
)


def DistributedGradientTape(tape, model, **kwargs):  # noqa: N802 (Horovod's name)
    """Wraps ``tape`` so ``gradient()`` allreduces global variables and rescales local ones.

    Args:
        tape: A ``tf.GradientTape`` that recorded the loss.
        model: The model or layer (or list of variables) holding the local variables.
        **kwargs: Passed to ``horovod.tensorflow.DistributedGradientTape``.

    Returns:
        ``tape`` itself in a single process; otherwise Horovod's distributed tape with the
        local variables registered (their gradients are divided by the world size, never
        allreduced), asking for generic allreduce names.

    Horovod names each allreduce after its gradient tensor by default; in graph mode ranks
    whose graphs differ (they hold different shards) would derive different names and wait
    for each other forever. Generic names count only the allreduced gradients, which are
    the same on every rank.
    """
    h = comm.hvd()
    if h is None or h.size() == 1:
        return tape
    # sparse_as_dense: the only global IndexedSlices gradients are those of data-parallel
    # tables (small by definition); Horovod would allgather them under tensor-derived names.
    kwargs.setdefault("sparse_as_dense", True)
    # local gradients are divided by the world size here (as compat.horovod's optimizer
    # does): Horovod 0.28.1's own scaling divides a float gradient by an int32 size tensor
    # under elastic (a TypeError in every custom loop of an elastic job)
    wrapped = h.DistributedGradientTape(tape, scale_local_gradients=False, **kwargs)
    local = local_variables(model)
    for var in local:
        wrapped.register_local_source(var)
    return _GenericNamesTape(wrapped, local, h.size())


class _GenericNamesTape:
    """Horovod's tape, asked for generic allreduce names (``grad_0``, ...), the local
    sources' gradients divided by the world size."""

    def __init__(self, tape, local, size: int):
        self._tape = tape
        self._local = {var.ref() for var in local}
        self._size = float(size)

    def gradient(self, target, sources, output_gradients=None):
        """Like ``tf.GradientTape.gradient``, with local and global gradients handled."""
        grads = self._tape.gradient(target, sources, output_gradients, use_generic_names=True)
        return tf.nest.map_structure(self._scaled, sources, grads)

    def _scaled(self, source, grad):
        if grad is None or not hasattr(source, "ref") or source.ref() not in self._local:
            return grad
        return scaled_local_gradient(grad, self._size)

    def __getattr__(self, attr):
        return getattr(self._tape, attr)


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Broadcasts every global variable from ``root_rank``; local ones keep their values."""
    comm.broadcast_variables([v for v in variables if not is_local(v)], root_rank=root_rank)


__all__ = [
    "DistributedGradientTape",
    "broadcast_variables",
    "is_local",
    "local_variables",
    "mark_optimizer_slots",
    "slot",
    "slot_names",
]
