"""A row given to a new key starts afresh: its values drawn from the key, its optimizer state
at the optimizer's initial values (an evicted key's Adagrad sum or Adam moments must not
carry over to the key that takes its row).

Each optimizer slot starts at its initial value: zero for moments and momenta, the
optimizer's ``initial_accumulator_value`` for Adagrad's (element-wise and row-wise) sums. A
slot this module does not know is refused, naming it, rather than left holding the evicted
key's state.
"""

from __future__ import annotations

import functools
import logging

import tensorflow as tf

from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.dynamic.keys import initial_rows
from merlin_models_de.variables import optimizer_parts, slot_holder

ZERO = ("m", "v", "vhat", "momentum", "rms", "mg", "linear")
ACCUMULATORS = ("accumulator", "row_accumulator")


def optimizer_state(optimizer):
    """``state(var) -> [(slot variable, initial value)]`` for ``optimizer``; None without one."""
    if optimizer is None:
        return None
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer  # loss-scale wrapper

    def state(var) -> list:
        # new-style optimizers build their slots once, for the variables of their first call
        built_once = [
            p
            for p in optimizer_parts(inner)
            if not hasattr(p, "optimizers_and_blocks")  # Merlin's MultiOptimizer delegates
            and not keras_compat.creates_slots_per_variable(p)
        ]
        if built_once:
            raise NotImplementedError(
                "A dynamic table resets the optimizer state of the rows it gives to new keys, "
                "which needs a legacy Keras optimizer (tf.keras.optimizers.legacy, or a name "
                f"such as 'adagrad' in compile). Received: optimizer={type(built_once[0]).__name__}"
            )
        # created now if they do not exist yet, as the first step would: a training step's
        # forward reads them before its optimizer does
        with tf.init_scope():
            keras_compat.create_optimizer_slots(inner, [var])
        owner, slots = slot_holder(inner, var)
        out = []
        for name, slot in slots.items():
            if name in ZERO:
                out.append((slot, 0.0))
            elif name in ACCUMULATORS:
                out.append((slot, float(owner.get_config()["initial_accumulator_value"])))
            else:
                raise NotImplementedError(
                    f"A dynamic table resets the optimizer state of rows given to new keys; "
                    f"{type(owner).__name__}'s slot {name!r} has no known initial value. "
                    f"Received: optimizer={type(owner).__name__}"
                )
        return out

    return state


def row_reset(var, initializer, table: str, optimizer_state=None):
    """``reset(rows, keys)`` for this rank's slice ``var`` of dynamic ``table``.

    ``optimizer_state(var)``: ``[(slot variable, initial value)]`` of the optimizer that
    trains ``var`` (:func:`optimizer_state` of the training step's optimizer); None: no optimizer state
    to reset (a custom loop, or SGD).
    """

    def reset(rows, keys) -> None:
        at = rows[:, None]
        var.scatter_nd_update(at, initial_rows(initializer, keys, var.shape[1], table, var.dtype))
        for slot, value in optimizer_state(var) if optimizer_state is not None else ():
            shape = tf.stack([tf.shape(rows)[0], slot.shape[1]])
            slot.scatter_nd_update(at, tf.fill(shape, tf.cast(value, slot.dtype)))

    return reset


@functools.lru_cache(maxsize=None)  # once per table and process
def warn_unreset_state(table: str) -> None:
    """Says once per table that a training call outside Merlin's ``fit`` (a custom loop, a
    plain Keras model's ``fit``) admits keys without starting a reused row's optimizer state
    afresh: the optimizer is known only inside Merlin's training step."""
    logging.getLogger("merlin_models_de").warning(
        "Dynamic table '%s' is trained outside Merlin's fit: keys are admitted, but a row "
        "taken from an evicted key keeps that key's optimizer state (docs/dynamic.md).",
        table,
    )
