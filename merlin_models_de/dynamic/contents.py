"""What a dynamic table holds, read from every rank: its keys with their rows, and its
counters (collectives: every rank calls them)."""

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


def counters(keymap) -> dict:
    """This table's ``{"keys", "admitted", "evicted"}`` summed over ranks (collective)."""
    mine = np.array(
        [
            int((keymap.table.counts.numpy() > 0).sum()),
            int(keymap.admitted.numpy()),
            int(keymap.evicted.numpy()),
        ]
    )
    total = np.sum(comm.allgather_object(mine), axis=0)
    return dict(zip(("keys", "admitted", "evicted"), (int(v) for v in total)))


def whole_map(keymap, default_row) -> dict:
    """Collective: one dynamic table's map over every rank, slot arrays in rank order (the
    table's row order), with its default row and counters: what a one-process copy of the
    table holds (:func:`load_whole_map`)."""
    t = keymap.table
    mine = (t.keys.numpy(), t.counts.numpy(), t.seen.numpy())
    parts = comm.allgather_object(mine)
    out = {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(SLOT_ARRAYS)}
    out["default"] = default_row.numpy()
    out["step"] = int(keymap.step.numpy())
    counted = counters(keymap)
    out["admitted"], out["evicted"] = counted["admitted"], counted["evicted"]
    return out


SLOT_ARRAYS = ("keys", "counts", "seen")


def load_whole_map(keymap, default_row, whole: dict) -> None:
    """Sets a one-process table's map to :func:`whole_map`'s (its keys keep their rows);
    the candidates of keys not yet admitted start empty."""
    t = keymap.table
    for name in SLOT_ARRAYS:
        getattr(t, name).assign(whole[name])
    t.rebuild_index()
    default_row.assign(whole["default"])
    keymap.step.assign(whole["step"])
    keymap.admitted.assign(whole["admitted"])
    keymap.evicted.assign(whole["evicted"])
