"""What a checkpoint holds of a model: every array, under the name it is saved as.

A model's state is its embedding blocks' shards (a dynamic table's with its key map, see
:mod:`.keymaps`), its dense weights (with the dynamic tables' default rows, which every rank
holds alike) and its optimizer's state:
for every variable its slots (``accumulator``, ``m``, ``v``, ...) and the optimizer's other
variables (``iterations`` and the like). An optimizer whose state cannot be told apart this
way is refused with its name, never saved in part.

Example:
    >>> state = model_state(model)  # doctest: +SKIP
    >>> [name for name, _ in state.parts(var)]  # doctest: +SKIP
    ['table', 'accumulator']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.persistence.io import BFLOAT16, disk_dtype
from merlin_models_de.variables import (
    dense_weights,
    embedding_blocks,
    is_row_state,
    optimizer_parts,
    optimizer_variables,
    slots_of,
)


def dtype_name(var) -> str:
    """The dtype a manifest names for a variable or a TensorFlow dtype (``bfloat16``, not
    its bits' uint16)."""
    dtype = getattr(var, "dtype", var)
    return BFLOAT16 if dtype.name == BFLOAT16 else np.dtype(dtype.as_numpy_dtype).name


def numpy_dtype(var) -> np.dtype:
    """The NumPy dtype a TensorFlow variable's values are written in (see ``io.BFLOAT16``)."""
    return disk_dtype(dtype_name(var))


def optimizer_label(optimizer) -> str | None:
    """A readable name for an optimizer and the ones inside it: ``MultiOptimizer(Adagrad,
    Adam)``; None for None."""
    if optimizer is None:
        return None
    parts = optimizer_parts(optimizer)
    inner = [type(p).__name__ for p in parts[1:]]
    return type(optimizer).__name__ + (f"({', '.join(inner)})" if inner else "")


@dataclass
class ModelState:
    """A model's blocks, dense weights and optimizer, with the optimizer's slots created.

    Attributes:
        blocks: The embedding blocks, in discovery order.
        dense: The weights outside the blocks, in ``model.weights`` order, then the blocks'
            dynamic tables' default rows (in block and table order).
        optimizer: The model's optimizer, or None.
        extra: The optimizer's variables that are nobody's slot (``iterations`` and other
            scalars), in a fixed order.
    """

    blocks: list
    dense: list
    optimizer: Any
    extra: list

    @property
    def label(self) -> str | None:
        """The optimizer's readable name (see :func:`optimizer_label`)."""
        return optimizer_label(self.optimizer)

    def parts(self, var) -> list:
        """``[("table", var), (slot name, slot), ...]`` for a shard variable."""
        return [("table", var)] + sorted(self.slots(var).items())

    def per_row(self, var) -> dict:
        """``{part name: True when saved one value per row}`` of a shard variable's parts."""
        return {name: is_row_state(v) for name, v in self.parts(var)}

    def slots(self, var) -> dict:
        """``{slot name: slot}`` of ``var`` ({} without an optimizer)."""
        return slots_of(self.optimizer, var) if self.optimizer is not None else {}


def model_state(model) -> ModelState:
    """The state of ``model``, creating its optimizer's slots first (as its first training step
    would), so every checkpoint of a compiled model holds the complete optimizer state.

    Raises:
        NotImplementedError: naming the optimizer, when a part of its state cannot be saved
            (it lives outside the optimizer's variables, or a slot of a sharded table is not
            shaped like the shard).
        ValueError: when two of the model's variables claim the same slot (equal names).
    """
    blocks = embedding_blocks(model)
    dense = dense_weights(model, blocks) + default_rows(blocks)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return ModelState(blocks, dense, None, [])
    keras_compat.create_optimizer_slots(optimizer, model.trainable_variables)
    state = ModelState(blocks, dense, optimizer, [])
    claimed = _claimed_slots(state, model.weights)
    _check_shard_slots(state, blocks)
    state.extra = _extra_variables(state, claimed)
    return state


def default_rows(blocks) -> list:
    """The dynamic tables' default rows: one trainable row per table, the same on every
    rank (trained like the dense weights, so saved like them, by rank 0)."""
    out = []
    for block in blocks:
        defaults = getattr(block.backend, "defaults", {})
        out += [defaults[t.name] for t in block.plan.tables if t.name in defaults]
    return out


def _claimed_slots(state, variables) -> set:
    """Refs of every slot of ``variables``; raises when one slot would be saved twice."""
    owner: dict = {}
    for var in variables:
        for name, s in state.slots(var).items():
            other = owner.setdefault(s.ref(), var)
            if other is not var:
                raise ValueError(
                    f"Cannot tell whose optimizer slot '{name}' is: variables '{other.name}' and "
                    f"'{var.name}' both match it by name ({state.label} names slots after "
                    f"their variable). Received: slot={s.name!r}"
                )
    return set(owner)


def _check_shard_slots(state, blocks) -> None:
    """Slots of table shards are saved and restored row by row, so they must be shaped and
    typed like their shard (Adafactor's factored slots are not), or hold one value per row
    (a row-wise optimizer's ``[rows, 1]``, float32 also for a 16-bit table)."""
    for block in blocks:
        for shard in block.plan.shards_on(block.rank):
            var, _ = block.backend.shard_variable(shard)
            for name, s in state.slots(var).items():
                shape = (var.shape[0], 1) if is_row_state(s) else var.shape
                if s.shape != shape or not (s.dtype == var.dtype or is_row_state(s)):
                    raise NotImplementedError(
                        f"Checkpoints cannot hold the slot '{name}' of {state.label} for the "
                        f"sharded table '{shard.table}': it is not shaped like the table "
                        f"({s.shape} vs {shape}). Received: optimizer={state.label}"
                    )


def _extra_variables(state, claimed) -> list:
    """The optimizer's variables outside ``claimed``; all must be scalars (iterations, ...)."""
    seen, out = set(claimed), []
    for part in optimizer_parts(state.optimizer):
        for var in optimizer_variables(part):
            if var.ref() in seen:
                continue
            seen.add(var.ref())
            if var.shape.rank != 0:
                raise NotImplementedError(
                    f"Checkpoints cannot hold the state of {state.label}: its variable "
                    f"'{var.name}' is neither a slot of one of the model's variables nor a "
                    f"scalar. Received: optimizer={state.label}"
                )
            out.append(var)
    return out
