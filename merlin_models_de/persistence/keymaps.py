"""Dynamic tables in a sharded checkpoint: each rank's key map saved beside its shard, and
re-homed to the ranks that own its keys when restored.

A dynamic table's shard is saved like any row-sliced shard (its rows and their optimizer
slots, by the table's row order); beside it each rank writes its key map
(:func:`.dynamic.contents.local_map`: the key, count and last step of each slot, the same
for its candidates, and its step and counters), in the files :data:`.layout.MAP_FILES`
name. The default row is saved with the dense weights (every rank holds it alike).

A restore gives each saved key to its owner in the world there is now (:func:`.dynamic.keys.
owner_of` at the new size). Every rank reads every saved rank's key map (24 bytes a slot,
in chunks) and keeps the keys it owns; a key keeps the slot it had where that slot lies in
the rank's share (always, when the world size is the one saved, or one process), and takes
a free slot otherwise (:func:`.dynamic.rehome.rehome`). Its row and optimizer state follow
it: they are read from the saved shard that held it. A rank that owns more keys than its
share has rows evicts by the table's policy, and the restore says so on rank 0
(:func:`notices`). Counters: into the world size saved, each rank's own; into another, their
sums on rank 0 (what ``dynamic_counters`` reports), each rank adding its evictions.

Example:
    >>> rehomed = plan_map(path, saved_block, block, shard)  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from merlin_models_de import comm
from merlin_models_de.dynamic.contents import load_map, local_map
from merlin_models_de.dynamic.rehome import candidate_rows, rehome
from merlin_models_de.persistence.disk import npy_bytes
from merlin_models_de.persistence.io import load_array, write_array
from merlin_models_de.persistence.layout import MAP_FILES, map_stem, shard_file
from merlin_models_de.persistence.manifest import MAP_COLUMNS

CHUNK_ROWS = 2**20  # saved slots read at a time when finding this rank's keys


def keymap_of(block, table: str):
    """The key map of ``table`` on this rank, None for a fixed table."""
    return getattr(block.backend, "keymaps", {}).get(table)


def map_stems(block_index: int, table_index: int, option) -> dict:
    """``{what: stem}`` of a dynamic table's map files (no candidates without a store)."""
    return {
        what: map_stem(block_index, table_index, what)
        for what in MAP_FILES
        if what != "candidates" or candidate_rows(option, 1)
    }


def map_bytes(shard, option) -> int:
    """Bytes a rank writes for its key map of ``shard``."""
    rows = [shard.rows, candidate_rows(option, shard.rows)]
    return sum(npy_bytes((n, MAP_COLUMNS), 8) for n in rows if n) + npy_bytes((MAP_COLUMNS,), 8)


def write_map(root: str, stems: dict, rank: int, keymap) -> list:
    """Writes this rank's key map into the files ``stems`` name; returns their paths."""
    arrays = local_map(keymap)
    written = []
    for what, stem in stems.items():
        path = shard_file(root, stem, rank)
        write_array(path, arrays[what])
        written.append(path)
    return written


# ---- restore ----------------------------------------------------------------------------------


@dataclass
class Rehomed:
    """What a restore writes into this rank's key map of one dynamic table, and the rows
    that move to another slot."""

    block: str
    table: str
    keymap: object
    slots: np.ndarray  # [rows, 3]
    candidates: np.ndarray | None  # [store, 3], None without a store
    counters: np.ndarray  # step, admitted, evicted
    moves: list = field(default_factory=list)  # (saved shard, its rows, rows of this shard)
    stats: dict = field(default_factory=dict)  # keys, evicted, candidates, forgotten

    def load(self) -> None:
        load_map(self.keymap, self.slots, self.candidates, self.counters)


@dataclass
class _Entries:
    """Used slots of the saved maps that this rank owns now, by saved rank then slot."""

    slots: np.ndarray  # [n, 3]
    shard: np.ndarray  # the saved shard's index in the list of saved shards
    row: np.ndarray  # the slot in that saved shard


def _owned(path, saved_map, old_shards, what, world_size, rank) -> _Entries:
    from merlin_models_de.dynamic.keys import owner_of  # TensorFlow: restores only

    found = []
    for i, old in enumerate(old_shards):
        if what not in saved_map.stems:
            break
        stem, shape = saved_map.arrays(old)[what]
        data = load_array(shard_file(path, stem, old.rank), shape, np.int64)
        for lo in range(0, shape[0], CHUNK_ROWS):
            part = np.asarray(data[lo : lo + CHUNK_ROWS])
            used = np.flatnonzero(part[:, 1] > 0)
            owners = owner_of(part[used, 0], world_size).numpy() if world_size > 1 else 0
            mine = used[owners == rank] if world_size > 1 else used
            found.append((part[mine], np.full(len(mine), i), lo + mine))
    if not found:
        return _Entries(np.zeros([0, MAP_COLUMNS], np.int64), np.zeros(0, int), np.zeros(0, int))
    return _Entries(*(np.concatenate([f[k] for f in found]) for k in range(3)))


def _placed(entries: _Entries, homes, rows: int, policy) -> tuple[np.ndarray, np.ndarray, int]:
    """``(the [rows, 3] store, each entry's slot (-1: evicted), evicted)``."""
    slots, evicted = rehome(entries.slots[:, 1], entries.slots[:, 2], homes, rows, policy)
    store = np.zeros([rows, MAP_COLUMNS], np.int64)
    kept = slots >= 0
    store[slots[kept]] = entries.slots[kept]
    return store, slots, evicted


def plan_map(path: str, saved, block, shard) -> Rehomed:
    """This rank's key map of the dynamic table of ``shard`` (its shard in ``block``), from
    the saved block ``saved``: the keys it owns now, their slots and the rows that move."""
    world_size, rank = block.plan.world_size, block.rank
    option = block.plan.table(shard.table).dynamic
    saved_map = saved.maps[shard.table]
    old_shards = sorted(saved.plan.stored_shards_of(shard.table), key=lambda s: s.rank)
    keys = _owned(path, saved_map, old_shards, "keymap", world_size, rank)
    starts = np.array([s.row_start for s in old_shards], np.int64)
    local = starts[keys.shard] + keys.row - shard.row_start if len(keys.row) else keys.row
    homes = np.where((local >= 0) & (local < shard.rows), local, -1)
    slots, where, evicted = _placed(keys, homes, shard.rows, option.evict)

    moved = (where >= 0) & (where != homes)
    moves = [
        (old, keys.row[moved & (keys.shard == i)], where[moved & (keys.shard == i)])
        for i, old in enumerate(old_shards)
        if np.any(moved & (keys.shard == i))
    ]

    store = candidate_rows(option, shard.rows)
    candidates, forgotten, waiting = None, 0, 0
    if store:
        cands = _owned(path, saved_map, old_shards, "candidates", world_size, rank)
        ranks = np.array([s.rank for s in old_shards])[cands.shard]
        cand_homes = np.where((ranks == rank) & (cands.row < store), cands.row, -1)
        candidates, _, forgotten = _placed(cands, cand_homes, store, "lru")
        waiting = len(cands.row)

    counters = _counters(path, saved_map, old_shards, world_size, rank)
    counters[2] += evicted
    return Rehomed(
        block.name,
        shard.table,
        keymap_of(block, shard.table),
        slots,
        candidates,
        counters,
        moves,
        {"keys": len(keys.row), "evicted": evicted, "candidates": waiting, "forgotten": forgotten},
    )


def _counters(path, saved_map, old_shards, world_size, rank) -> np.ndarray:
    saved = {
        old.rank: np.asarray(
            load_array(
                shard_file(path, saved_map.stems["counters"], old.rank), (MAP_COLUMNS,), np.int64
            )
        )
        for old in old_shards
    }
    if len(old_shards) == world_size and rank in saved:  # the world size saved
        return saved[rank].copy()
    step = max(int(c[0]) for c in saved.values())
    if rank != 0:
        return np.array([step, 0, 0], np.int64)
    return np.array([step] + [sum(int(c[k]) for c in saved.values()) for k in (1, 2)], np.int64)


def notices(per_rank: list, saved_world: int) -> list[str]:
    """The lines rank 0 prints for the tables where a rank evicted keys or forgot candidates
    when re-homed (``per_rank``: each rank's ``{(block, table): stats}``)."""
    lines = []
    for key in sorted({k for mine in per_rank for k in mine}):
        stats = [mine.get(key, {}) for mine in per_rank]
        evicted = [s.get("evicted", 0) for s in stats]
        forgotten = [s.get("forgotten", 0) for s in stats]
        if not any(evicted) and not any(forgotten):
            continue
        keys = sum(s.get("keys", 0) for s in stats)
        waiting = sum(s.get("candidates", 0) for s in stats)
        lines.append(
            f"merlin_models_de: dynamic table '{key[1]}' (block '{key[0]}') restored from "
            f"{saved_world} rank(s) into {len(per_rank)}: {sum(evicted)} of {keys} keys evicted "
            f"by its policy, their new owner's share being full (per rank: {evicted}); "
            f"{sum(forgotten)} of {waiting} candidates forgotten (per rank: {forgotten})."
        )
    return lines


def print_notices(per_rank: list, saved_world: int) -> None:
    if comm.rank() == 0:
        for line in notices(per_rank, saved_world):
            print(line, file=sys.stderr, flush=True)
