"""Model queries: which blocks a model holds, which variables are local, optimizer slots.

A leaf module: it imports nothing from this package, so every other module may use it.
"Local" variables are the ones whose contents differ by rank (sharded tables and their
optimizer slots): they are never allreduced, broadcast, or saved by rank 0 alone.

Example:
    >>> blocks = embedding_blocks(model)  # doctest: +SKIP
    >>> [v.name for v in local_variables(model)]  # doctest: +SKIP
"""
from __future__ import annotations

LOCAL_ATTR = "_mmde_local"  # set on a variable by the backend base class, read here only
BLOCK_ATTR = "_mmde_embedding_block"  # class attribute of the DistributedEmbeddings block


def is_local(var) -> bool:
    """True for variables whose contents differ by rank (sharded tables and their slots)."""
    return bool(getattr(var, LOCAL_ATTR, False))


def mark_local(var) -> None:
    """Marks ``var`` as local (see the module docstring)."""
    setattr(var, LOCAL_ATTR, True)


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


def slot_names(optimizer) -> list:
    """The slot names of an optimizer (legacy or new Keras); [] for None or none."""
    if optimizer is None:
        return []
    inner = getattr(optimizer, "_optimizer", None)  # Horovod / loss-scale wrappers
    if hasattr(optimizer, "get_slot_names"):
        return list(optimizer.get_slot_names())
    if inner is not None and inner is not optimizer:
        return slot_names(inner)
    return []


def slot(optimizer, var, name):
    """The optimizer's slot ``name`` of ``var``, or None where it has none (yet)."""
    try:
        return optimizer.get_slot(var, name)
    except (KeyError, ValueError, AttributeError):
        return None


def slots_of(optimizer, var) -> dict:
    """``{slot name: slot variable}`` of ``var`` (only the slots that exist)."""
    out = {}
    for name in slot_names(optimizer):
        s = slot(optimizer, var, name)
        if s is not None:
            out[name] = s
    return out


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
