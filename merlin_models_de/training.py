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


def is_local(var) -> bool:
    """True for variables whose contents differ by rank (sharded tables and their slots)."""
    return bool(getattr(var, "_mmde_local", False))


def local_variables(obj) -> list:
    """The local variables of a model / layer / list of variables."""
    variables = obj.variables if hasattr(obj, "variables") else list(obj)
    return [v for v in variables if is_local(v)]


def DistributedGradientTape(tape, model, **kwargs):  # pylint: disable=invalid-name
    """Wraps ``tape`` so ``gradient()`` allreduces global variables and rescales local ones.

    Args:
        tape: A ``tf.GradientTape`` that recorded the loss.
        model: The model or layer (or list of variables) holding the local variables.
        **kwargs: Passed to ``horovod.tensorflow.DistributedGradientTape``.

    Returns:
        ``tape`` itself in a single process; otherwise Horovod's distributed tape with the
        local variables registered (their gradients are divided by the world size, never
        allreduced).
    """
    h = comm.hvd()
    if h is None or h.size() == 1:
        return tape
    # sparse_as_dense: the only global IndexedSlices gradients are those of data-parallel
    # tables (small by definition); Horovod would allgather them under names taken from the
    # gradient tensors, which differ between ranks in graph mode and deadlock.
    kwargs.setdefault("sparse_as_dense", True)
    wrapped = h.DistributedGradientTape(tape, scale_local_gradients=True, **kwargs)
    for var in local_variables(model):
        wrapped.register_local_source(var)
    return _GenericNamesTape(wrapped)


class _GenericNamesTape:
    """Horovod's tape, asked for generic allreduce names (``grad_0``, ...).

    By default Horovod names each allreduce after its gradient tensor; in graph mode ranks
    whose graphs differ (they hold different shards) get different names and wait for each
    other forever. Generic names count only the allreduced (global) gradients, which are the
    same on every rank.
    """

    def __init__(self, tape):
        self._tape = tape

    def gradient(self, target, sources, output_gradients=None):
        """Like ``tf.GradientTape.gradient``, with local and global gradients handled."""
        return self._tape.gradient(target, sources, output_gradients, use_generic_names=True)

    def __getattr__(self, attr):
        return getattr(self._tape, attr)


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Broadcasts every global variable from ``root_rank``; local ones keep their values."""
    h = comm.hvd()
    if h is None or h.size() == 1:
        return
    global_vars = [v for v in variables if not is_local(v)]
    if global_vars:
        h.broadcast_variables(global_vars, root_rank=root_rank)


def slot_names(optimizer) -> list:
    """The slot names of a (legacy Keras) optimizer; [] for None or optimizers without slots."""
    if optimizer is None or not hasattr(optimizer, "get_slot_names"):
        return []
    return list(optimizer.get_slot_names())


def slot(optimizer, var, name):
    """The optimizer's slot ``name`` of ``var``, or None where it has none (yet)."""
    try:
        return optimizer.get_slot(var, name)
    except (KeyError, ValueError, AttributeError):
        return None


def mark_optimizer_slots(optimizer, variables) -> None:
    """Marks the optimizer slots of local variables as local too (call after they exist)."""
    for var in variables:
        if is_local(var):
            for name in slot_names(optimizer):
                s = slot(optimizer, var, name)
                if s is not None:
                    s._mmde_local = True  # pylint: disable=protected-access


__all__ = ["DistributedGradientTape", "broadcast_variables", "is_local", "local_variables",
           "mark_optimizer_slots", "slot", "slot_names"]
