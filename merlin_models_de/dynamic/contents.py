"""What a dynamic table holds: its keys with their rows and its counters, read from every
rank (collectives: every rank calls them); one rank's map as arrays and back
(:func:`local_map`, :func:`load_map`: what a sharded checkpoint saves and restores), and
every rank's map as one process's (:func:`whole_map`, :func:`load_whole_map`: the export)."""

from __future__ import annotations

import numpy as np

from merlin_models_de import comm


def rows_by_key(keymap, var) -> tuple[np.ndarray, np.ndarray]:
    """This rank's ``(keys, rows)`` of one dynamic table (its slice ``var``), by row."""
    used = keymap.table.counts.numpy() > 0
    rows = var.numpy()[used]
    return keymap.table.keys.numpy()[used], rows


def gathered(keymap, var) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's ``(keys, rows)`` of one dynamic table, sorted by key (collective)."""
    parts = comm.allgather_object(rows_by_key(keymap, var))
    keys = np.concatenate([k for k, _ in parts])
    rows = np.concatenate([r for _, r in parts])
    order = np.argsort(keys, kind="stable")
    return keys[order], rows[order]


COUNTERS = ("keys", "admitted", "evicted")


def local_counters(keymap) -> dict:
    """This rank's share of one table: ``{"keys", "admitted", "evicted"}`` (keys: how many hold
    a row now). Not collective."""
    mine = (
        int((keymap.table.counts.numpy() > 0).sum()),
        int(keymap.admitted.numpy()),
        int(keymap.evicted.numpy()),
    )
    return dict(zip(COUNTERS, mine))


def counters(keymap) -> dict:
    """This table's ``{"keys", "admitted", "evicted"}`` summed over ranks (collective)."""
    parts = comm.allgather_object(local_counters(keymap))
    return {name: sum(part[name] for part in parts) for name in COUNTERS}


def slot_arrays(table) -> np.ndarray:
    """int64 ``[slots, 3]``: each slot's key, count (0: empty) and last step, of a
    :class:`.keymap.SlotTable` (the key map's rows, or its candidates)."""
    return np.stack([getattr(table, name).numpy() for name in SLOT_ARRAYS], axis=1)


def local_map(keymap) -> dict:
    """This rank's map: ``keymap`` (its slots, :func:`slot_arrays`), ``candidates`` (the same of its
    candidates store; ``[0, 3]`` without one) and ``counters`` (step, admitted, evicted)."""
    none = np.zeros([0, len(SLOT_ARRAYS)], np.int64)
    return {
        "keymap": slot_arrays(keymap.table),
        "candidates": none if keymap.candidates is None else slot_arrays(keymap.candidates),
        "counters": np.array(
            [int(v.numpy()) for v in (keymap.step, keymap.admitted, keymap.evicted)], np.int64
        ),
    }


def whole_map(keymap, default_row) -> dict:
    """Collective: one dynamic table's map over every rank, slot arrays in rank order (the
    table's row order), with its default row and counters: what a one-process copy of the
    table holds (:func:`load_whole_map`)."""
    parts = comm.allgather_object(local_map(keymap)["keymap"])
    slots = np.concatenate(parts)
    out = {name: slots[:, i] for i, name in enumerate(SLOT_ARRAYS)}
    out["default"] = default_row.numpy()
    out["step"] = int(keymap.step.numpy())
    counted = counters(keymap)
    out["admitted"], out["evicted"] = counted["admitted"], counted["evicted"]
    return out


SLOT_ARRAYS = ("keys", "counts", "seen")


def load_map(keymap, slots, candidates=None, counters=None) -> None:
    """Sets a rank's map: its slots (``[rows, 3]``, :func:`slot_arrays`), its candidates
    (the same for its store; None: empty) and ``(step, admitted, evicted)``; the indexes
    are rebuilt from the slots."""
    tables = [(keymap.table, slots)]
    if keymap.candidates is not None:
        empty = np.zeros([keymap.candidates.rows, len(SLOT_ARRAYS)], np.int64)
        tables.append((keymap.candidates, empty if candidates is None else candidates))
    for table, arrays in tables:
        for i, name in enumerate(SLOT_ARRAYS):
            getattr(table, name).assign(arrays[:, i])
        table.rebuild_index()
    if counters is not None:
        for var, value in zip((keymap.step, keymap.admitted, keymap.evicted), counters):
            var.assign(int(value))


def load_whole_map(keymap, default_row, whole: dict) -> None:
    """Sets a one-process table's map to :func:`whole_map`'s (its keys keep their rows);
    the candidates of keys not yet admitted start empty."""
    slots = np.stack([whole[name] for name in SLOT_ARRAYS], axis=1)
    load_map(keymap, slots, None, (whole["step"], whole["admitted"], whole["evicted"]))
    default_row.assign(whole["default"])
