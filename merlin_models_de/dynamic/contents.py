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
