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

from merlin_models_de import comm
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
        allreduced).
    """
    return comm.distributed_tape(tape, local_variables(model), **kwargs)


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
