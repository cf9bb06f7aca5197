"""Model queries: which blocks a model holds, which variables are local, optimizer slots.

A leaf module: it imports nothing from this package, so every other module may use it.
"Local" variables are the ones whose contents differ by rank (sharded tables and their
optimizer slots): they are never allreduced, broadcast, or saved by rank 0 alone.

Example:
    >>> blocks = embedding_blocks(model)  # doctest: +SKIP
    >>> [v.name for v in local_variables(model)]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import NamedTuple

LOCAL_ATTR = "_mmde_local"  # set on a variable by the backend base class, read here only
BLOCK_ATTR = "_mmde_embedding_block"  # class attribute of the DistributedEmbeddings block
TABLE_ATTR = "_mmde_table"  # set on every table shard variable by the backend base class
COLUMN_SYNC_ATTR = "_mmde_column_sync"  # set on a backend's anchor (see column_sync)
ROW_STATE_ATTR = "_mmde_row_state"  # set on a [rows, 1] slot by a row-wise optimizer


def is_local(var) -> bool:
    """True for variables whose contents differ by rank (sharded tables and their slots)."""
    return bool(getattr(var, LOCAL_ATTR, False))


def mark_local(var) -> None:
    """Marks ``var`` as local (see the module docstring)."""
    setattr(var, LOCAL_ATTR, True)


class TableMark(NamedTuple):
    """What a table variable holds, for optimizers that treat tables by row.

    Attributes:
        table: The table's name.
        dim: The whole table's width (a column slice holds fewer columns).
        cols: The columns this variable holds.
        whole: The variable holds one shard exactly (False: a backend merged several).
        owner: Which block of this process holds it (an opaque key: two blocks may name
            their tables alike).
        first_row: The table row its row 0 holds (a row slice starts inside the table).
        first_col: The table column its column 0 holds.
    """

    table: str
    dim: int
    cols: int
    whole: bool = True
    owner: int = 0
    first_row: int = 0
    first_col: int = 0

    @property
    def column_sliced(self) -> bool:
        """The variable holds some of the table's columns only."""
        return self.cols != self.dim


def mark_table(var, mark: TableMark) -> None:
    """Marks ``var`` as (a shard of) an embedding table."""
    setattr(var, TABLE_ATTR, mark)


def table_mark(var) -> TableMark | None:
    """The :class:`TableMark` of a table variable, None for any other variable."""
    return getattr(var, TABLE_ATTR, None)


def is_table(var) -> bool:
    """Whether ``var`` holds (a shard of) an embedding table of the block."""
    return table_mark(var) is not None


def mark_column_sync(var, prefix: str, tables: tuple, owner: int) -> None:
    """Marks ``var`` (a variable every rank of a block holds and trains) with the block's
    collective ``prefix``, column-sliced ``tables`` and ``owner`` key (its table marks'): an
    optimizer that combines row statistics across a table's column slices issues one
    collective for them on every rank, whether the rank holds a slice or not."""
    setattr(var, COLUMN_SYNC_ATTR, (prefix, tuple(tables), owner))


def column_sync(var) -> tuple | None:
    """``(prefix, column-sliced tables, owner)`` of a variable :func:`mark_column_sync`
    marked, else None."""
    return getattr(var, COLUMN_SYNC_ATTR, None)


def mark_row_state(slot) -> None:
    """Marks an optimizer slot that holds one value per row of its table (``[rows, 1]``):
    checkpoints save it a column wide, whatever columns the shard holds."""
    setattr(slot, ROW_STATE_ATTR, True)


def is_row_state(slot) -> bool:
    """True for a slot :func:`mark_row_state` marked."""
    return bool(getattr(slot, ROW_STATE_ATTR, False))


def has_row_state(optimizer) -> bool:
    """True when ``optimizer`` (or one inside it) keeps a slot :func:`mark_row_state` marked."""
    return any(is_row_state(v) for o in optimizer_parts(optimizer) for v in optimizer_variables(o))


def local_variables(obj) -> list:
    """The local variables of a model / layer / list of variables."""
    variables = obj.variables if hasattr(obj, "variables") else list(obj)
    return [v for v in variables if is_local(v)]


def is_embedding_block(layer) -> bool:
    """True for a ``DistributedEmbeddings`` block (checked by marker, no import needed)."""
    return bool(getattr(type(layer), BLOCK_ATTR, False))


def embedding_blocks(model) -> list:
    """The ``DistributedEmbeddings`` blocks inside ``model``, each once, in discovery order."""
    if is_embedding_block(model):
        return [model]
    seen, out = set(), []
    # Keras' own recursive walk of tracked layers (tf.Module.submodules trips over a compiled
    # model's weak-key attributes); the one Keras-private call outside compat.
    walk = getattr(model, "_flatten_layers", None)
    layers = walk(include_self=False, recursive=True) if walk is not None else ()
    for module in layers:
        if is_embedding_block(module) and id(module) not in seen:
            seen.add(id(module))
            out.append(module)
    return out


def dense_weights(model, blocks=None) -> list:
    """The model's weights that are not inside an embedding block, in ``model.weights`` order."""
    blocks = embedding_blocks(model) if blocks is None else blocks
    skip = {w.ref() for b in blocks for w in b.weights}
    return [w for w in model.weights if w.ref() not in skip]


# ---- optimizer slots ------------------------------------------------------------------------
#
# Optimizers keep per-variable state ("slots") in three ways, all handled here:
# - Keras' legacy optimizers (strings given to Merlin's compile become these; Merlin's LazyAdam
#   is one): ``get_slot_names()`` / ``get_slot(var, name)``.
# - Keras' new optimizers (``tf.keras.optimizers.*``) have no slot API. Each slot comes from
#   ``add_variable_from_reference``, which (as documented) names it ``<slot>/<variable name>``,
#   under whatever name scope was active when it was built: the suffix says whose slot it is,
#   the segment before it which one.
# - Containers: Merlin's ``MultiOptimizer`` (one optimizer per group of blocks) and Keras'
#   loss-scale wrappers (``inner_optimizer``). Horovod's ``DistributedOptimizer`` subclasses
#   the optimizer it wraps, so its slots are its own.


def optimizer_parts(optimizer) -> list:
    """``optimizer`` and every optimizer inside it, outermost first, each once; [] for None."""
    out, todo = [], [optimizer]
    while todo:
        opt = todo.pop(0)
        if opt is None or any(opt is seen for seen in out):
            continue
        out.append(opt)
        todo += _inner_optimizers(opt)
    return out


def _inner_optimizers(optimizer) -> list:
    inner = getattr(optimizer, "inner_optimizer", None)  # Keras' loss-scale wrappers
    if inner is not None:
        return [inner]
    if hasattr(optimizer, "optimizers_and_blocks"):  # Merlin's MultiOptimizer
        # its default optimizer, then the ones update() added: those override earlier ones
        updates = getattr(optimizer, "update_optimizers_and_blocks", None) or []
        return list(optimizer.optimizers) + [pair.optimizer for pair in updates]
    return []


def _slot_holders(optimizer) -> list:
    """The optimizers that keep slots themselves (containers only delegate)."""
    return [o for o in optimizer_parts(optimizer) if not _inner_optimizers(o)]


def optimizer_variables(optimizer) -> list:
    """The variables of one optimizer object (``variables`` is a method on legacy optimizers
    and a property on new ones)."""
    found = getattr(optimizer, "variables", None)
    if found is None:
        return []
    return list(found() if callable(found) else found)


def _is_legacy(optimizer) -> bool:
    return hasattr(optimizer, "get_slot_names")


def _named_slots(optimizer, var) -> dict:
    """``{slot name: slot}`` of ``var`` in a new-style Keras optimizer, found by name."""
    suffix = "/" + var.name
    out = {}
    for candidate in optimizer_variables(optimizer):
        name = candidate.name
        if name.endswith(suffix) and candidate is not var:
            head = name[: -len(suffix)]
            out[head.rsplit("/", 1)[-1]] = candidate
    return out


def _probe_slot_names(optimizer) -> list:
    """The slot names a new-style optimizer creates, read off a fresh copy built for one
    probe variable (they depend on its configuration: amsgrad, momentum, use_ema...)."""
    import tensorflow as tf  # only here: the rest of this module needs no TensorFlow

    fresh = type(optimizer).from_config(optimizer.get_config())
    probe = tf.Variable(tf.zeros([1, 1], tf.float32), name="mmde_slot_probe")
    fresh.build([probe])
    return list(_named_slots(fresh, probe))


def slot_names(optimizer) -> list:
    """The slot names of an optimizer (legacy or new Keras, or a container); [] for None."""
    names = []
    for holder in _slot_holders(optimizer):
        found = holder.get_slot_names() if _is_legacy(holder) else _probe_slot_names(holder)
        names += [n for n in found if n not in names]
    return names


def slots_of(optimizer, var) -> dict:
    """``{slot name: slot variable}`` of ``var`` (only the slots that exist)."""
    return slot_holder(optimizer, var)[1]


def slot_holder(optimizer, var) -> tuple:
    """``(the optimizer holding var's slots, {slot name: slot variable})``; ``(None, {})``
    where none does.

    In a container the last optimizer holding slots of ``var`` wins: Merlin's MultiOptimizer
    lets ``update()`` override an earlier assignment of a block.
    """
    found: tuple = (None, {})
    for holder in _slot_holders(optimizer):
        if _is_legacy(holder):
            mine = {}
            for name in holder.get_slot_names():
                try:
                    mine[name] = holder.get_slot(var, name)
                except (KeyError, ValueError, AttributeError):
                    continue
        else:
            mine = _named_slots(holder, var)
        found = (holder, mine) if mine else found
    return found


def slot(optimizer, var, name):
    """The optimizer's slot ``name`` of ``var``, or None where it has none (yet)."""
    return slots_of(optimizer, var).get(name)


def local_slot_refs(optimizer, variables) -> set:
    """Refs of the local variables among ``variables`` and of their optimizer slots."""
    mine = [v for v in variables if is_local(v)]
    refs = {v.ref() for v in mine}
    refs |= {s.ref() for v in mine for s in slots_of(optimizer, v).values()}
    return refs


def mark_optimizer_slots(optimizer, variables) -> None:
    """Marks the optimizer slots of local variables as local too (call after they exist)."""
    for var in variables:
        if is_local(var):
            for s in slots_of(optimizer, var).values():
                mark_local(s)
