"""Merlin Models' private API beyond its patches (:mod:`.merlin_hooks`): the loader's
sharding attributes and the schemas of a ``from_config`` copy."""

from __future__ import annotations

from merlin_models_de.compat.versions import ensure_supported


def take_local_rows(loader):
    """Makes a Merlin ``Loader`` read every row of its dataset on this rank.

    Under Horovod, ``mm.Loader`` shards by partition and broadcasts a shuffling seed; a
    dataset that already holds only this rank's rows needs neither. (Its constructor turns a
    ``global_rank`` of 0 into ``hvd.rank()``, so the attributes are reset afterwards.)
    """
    ensure_supported()
    loader.global_size, loader.global_rank, loader.seed_fn = 1, 0, None
    return loader


def loader_rows(loader) -> int:
    """Rows a Merlin ``Loader`` reads on this rank (per pass): the cached count its own
    ``len`` is computed from. Call only when the loader has a partition for this rank."""
    ensure_supported()
    return int(loader._buff_len)


def match_schemas(original, copy, opaque=()) -> None:
    """Give each layer of ``copy`` (``original.__class__.from_config(original.get_config())``)
    no schema where its counterpart in ``original`` has none.

    Why: Merlin 23.8's ``SequentialBlock.__init__`` hands its first layer's schema to every
    later layer. Rebuilt from a config, a DLRM's ``WithShortcut`` (interaction + bottom MLP)
    thus gets the input schema, which it did not have, and from then on filters its inputs to
    the schema's columns: the bottom MLP's output is dropped. The copy still runs, but its
    config (what a SavedModel stores) now rebuilds a different model, which fails at load
    time. Layers are paired in Keras' traversal order, not entering ``opaque`` layer types
    (whose sublayers depend on the world size); a structural mismatch raises.
    """
    mine, theirs = _layers(original, opaque), _layers(copy, opaque)
    pairs = list(zip(mine, theirs))
    if len(mine) != len(theirs) or any(type(a) is not type(b) for a, b in pairs):
        raise ValueError(
            "The model rebuilt from its config has a different structure; "
            f"cannot export it. Received: {type(original).__name__}"
        )
    for mine, theirs in pairs:
        if getattr(mine, "_schema", None) is None and getattr(theirs, "_schema", None) is not None:
            theirs._schema = None


def _layers(layer, opaque) -> list:
    """The schema-holding sublayers of ``layer`` in Keras' order, each once, without the
    insides of ``opaque`` types (shared layers such as Merlin's context hold no schema)."""
    out, seen = [], set()

    def walk(parent):
        for child in parent._flatten_layers(include_self=False, recursive=False):
            if id(child) in seen:
                continue
            seen.add(id(child))
            if hasattr(type(child), "has_schema"):
                out.append(child)
            if not isinstance(child, opaque):
                walk(child)

    walk(layer)
    return out
