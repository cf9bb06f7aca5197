"""A checkpoint's manifest: what it holds and where, checked field by field before use.

``manifest.json`` records the step, the save number, the world size, every block's sharding
plan, which file holds which table or optimizer slot (see :mod:`.layout` for the file
names), and the layout of the dense weights and the optimizer's other state in
``dense.npz``; for a dynamic table, the files of its key map (one set per saved rank, see
:data:`.layout.MAP_FILES`). :func:`read_manifest` checks its structure, the plans' geometry (the saved
shards tile each table exactly) and that every file it names lies inside the checkpoint;
:func:`check_complete` and :func:`read_full_tables` check the files it lists.
"""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass, field

import numpy as np

from merlin_models_de.dynamic.rehome import candidate_rows
from merlin_models_de.persistence.io import (
    StorageError,
    check_array,
    disk_dtype,
    from_disk,
    inside,
    load_array,
    read_json,
    write_json,
)
from merlin_models_de.persistence.layout import DENSE, MANIFEST, MAP_FILES, shard_file
from merlin_models_de.planner.types import ShardingPlan

FORMAT = "merlin-models-de/2"
_FILE_STEM = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*")


@dataclass(frozen=True)
class Part:
    """One saved array per shard of a table: the table itself or one optimizer slot."""

    name: str  # "table" or the slot's name
    stem: str  # file path inside the checkpoint, without "-r<rank>.npy"
    dtype: np.dtype
    per_row: bool = False  # one value per row (a row-wise optimizer's state), any columns
    saved_as: str | None = None  # the manifest's dtype name: "bfloat16" is stored as uint16

    def from_disk(self, array):
        """A read file's ``array`` as values of the dtype it was saved from."""
        return from_disk(array, self.saved_as or self.dtype.name)

    def shape(self, shard) -> tuple:
        """The shape of this part's file for ``shard``."""
        return part_shape(shard, self.per_row)

    def columns(self, shard) -> tuple:
        """``(first, count)`` of the columns this part's file for ``shard`` holds: a per-row
        part's single column stands for the whole row (every column slice saves the same)."""
        return (0, 1) if self.per_row else (shard.col_start, shard.cols)


def part_shape(shard, per_row: bool) -> tuple:
    """``(rows, columns)`` of a saved part of ``shard``: ``[rows, 1]`` for per-row state."""
    return (shard.rows, 1 if per_row else shard.cols)


MAP_COLUMNS = 3  # a key map file's columns: key, count (0: an empty slot), last step


@dataclass(frozen=True)
class SavedMap:
    """A dynamic table's key map: ``{what: file stem}`` (:data:`.layout.MAP_FILES`; no
    ``candidates`` for a table that admits at once), one file of each per saved rank."""

    stems: dict
    option: object  # the table's DynamicTable when it was saved

    def arrays(self, shard) -> dict:
        """``{what: (stem, shape)}`` of the files ``shard``'s rank saved (int64)."""
        shapes = {
            "keymap": (shard.rows, MAP_COLUMNS),
            "candidates": (candidate_rows(self.option, shard.rows), MAP_COLUMNS),
            "counters": (MAP_COLUMNS,),
        }
        return {what: (stem, shapes[what]) for what, stem in self.stems.items()}


@dataclass(frozen=True)
class SavedBlock:
    """One embedding block of a checkpoint."""

    name: str
    plan: ShardingPlan
    parts: dict  # table name -> tuple of Part, "table" first
    maps: dict = field(default_factory=dict)  # dynamic table name -> SavedMap


@dataclass(frozen=True)
class SavedDense:
    """One dense weight of a checkpoint, and its slots ``((name, shape, dtype), ...)``."""

    shape: tuple
    dtype: np.dtype
    slots: tuple


@dataclass(frozen=True)
class Manifest:
    """A checked manifest. ``raw`` is the JSON as read (``restore_checkpoint`` returns it)."""

    path: str
    step: int
    sequence: int
    world_size: int
    optimizer: str | None  # None: saved without optimizer state
    state: tuple  # non-slot optimizer state, ((name, shape, dtype), ...)
    blocks: tuple  # SavedBlock, ...
    dense: tuple  # SavedDense, ...
    raw: dict

    def dense_arrays(self) -> dict:
        """``{key in dense.npz: (shape, dtype)}`` (see :func:`dense_key`)."""
        out = {}
        for i, weight in enumerate(self.dense):
            out[dense_key(i)] = (weight.shape, weight.dtype)
            for k, (_, shape, dtype) in enumerate(weight.slots):
                out[dense_key(i, k)] = (shape, dtype)
        for j, (_, shape, dtype) in enumerate(self.state):
            out[state_key(j)] = (shape, dtype)
        return out


def dense_key(weight: int, slot: int | None = None) -> str:
    """Key in ``dense.npz`` of dense weight ``weight`` or of its ``slot``-th slot."""
    return f"w{weight}" if slot is None else f"w{weight}.s{slot}"


def state_key(index: int) -> str:
    """Key in ``dense.npz`` of the ``index``-th non-slot optimizer variable."""
    return f"o{index}"


def write_manifest(root: str, manifest: dict) -> None:
    """Writes ``root/manifest.json`` (flushed to disk: the checkpoint is complete with it)."""
    write_json(os.path.join(root, MANIFEST), manifest)


def read_manifest(root: str) -> Manifest:
    """Reads and checks ``root/manifest.json``: its structure, the plans' geometry, and that
    every file it names lies inside ``root``.

    Raises:
        StorageError: naming the manifest and the offending field and value.
    """
    path = os.path.join(root, MANIFEST)
    return _ManifestReader(root, path).read(read_json(path, "Checkpoint manifest"))


class _ManifestReader:
    """Checks a manifest's JSON field by field; every error names the file and the field."""

    def __init__(self, root, path):
        self.root, self.path = root, path

    def fail(self, field, value, why):
        text = repr(value)
        text = text if len(text) <= 200 else text[:200] + "..."
        return StorageError(
            f"Malformed checkpoint manifest {self.path}: {field} {why}. "
            f"Received: {field}={text}"
        )

    def get(self, obj, key, kind, field):
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(field, obj if not isinstance(obj, dict) else None, "is missing")
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise self.fail(field, value, f"must be of type {kind.__name__}")
        return value

    def count(self, obj, key, field, low=0):
        value = self.get(obj, key, int, field)
        if value < low:
            raise self.fail(field, value, f"must be >= {low}")
        return value

    def dtype(self, obj, key, field):
        text = self.get(obj, key, str, field)
        try:
            dtype = disk_dtype(text)
        except TypeError as exc:
            raise self.fail(field, text, "is not a dtype") from exc
        if dtype.kind not in "biuf":
            raise self.fail(field, text, "must be a numeric dtype")
        return dtype

    def shape(self, obj, key, field):
        value = self.get(obj, key, list, field)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
            raise self.fail(field, value, "must be a list of sizes")
        return tuple(value)

    def read(self, raw) -> Manifest:
        fmt = self.get(raw, "format", str, "format")
        if fmt != FORMAT:
            raise self.fail("format", fmt, f"is not supported (this version reads {FORMAT})")
        ident = raw.get("id")  # unique per save (restores compare it across ranks)
        if ident is not None and not isinstance(ident, str):
            raise self.fail("id", ident, "must be a string")
        optimizer = raw.get("optimizer")
        if optimizer is not None and not isinstance(optimizer, str):
            raise self.fail("optimizer", optimizer, "must be a string or null")
        state = tuple(
            (
                self.get(s, "name", str, f"state[{j}].name"),
                self.shape(s, "shape", f"state[{j}].shape"),
                self.dtype(s, "dtype", f"state[{j}].dtype"),
            )
            for j, s in enumerate(self.get(raw, "state", list, "state"))
        )
        blocks = tuple(
            self.block(i, b) for i, b in enumerate(self.get(raw, "blocks", list, "blocks"))
        )
        names = [b.name for b in blocks]
        if len(set(names)) != len(names):
            raise self.fail("blocks", names, "must have unique names")
        dense = tuple(self.dense(i, d) for i, d in enumerate(self.get(raw, "dense", list, "dense")))
        return Manifest(
            self.path,
            self.count(raw, "step", "step"),
            self.count(raw, "sequence", "sequence", 1),
            self.count(raw, "world_size", "world_size", 1),
            optimizer,
            state,
            blocks,
            dense,
            raw,
        )

    def block(self, i, raw) -> SavedBlock:
        field = f"blocks[{i}]"
        name = self.get(raw, "name", str, f"{field}.name")
        plan_dict = self.get(raw, "plan", dict, f"{field}.plan")
        try:
            plan = ShardingPlan.from_dict(plan_dict)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self.fail(f"{field}.plan", exc, "is not a sharding plan") from exc
        check_plan(plan, self.path, field)
        tables = self.get(raw, "tables", list, f"{field}.tables")
        if [self.get(t, "name", str, f"{field}.tables.name") for t in tables] != [
            t.name for t in plan.tables
        ]:
            raise self.fail(
                f"{field}.tables",
                [t.get("name") for t in tables],
                "must name the plan's tables in the plan's order",
            )
        parts = {t["name"]: self.parts(f"{field}.tables[{j}]", t) for j, t in enumerate(tables)}
        maps = {}
        for j, (raw_table, spec) in enumerate(zip(tables, plan.tables)):
            saved = self.keymap(f"{field}.tables[{j}]", raw_table, spec)
            if saved is not None:
                maps[spec.name] = saved
        return SavedBlock(name, plan, parts, maps)

    def keymap(self, field, raw, spec) -> SavedMap | None:
        """A dynamic table's ``map`` (its file stems); None for a fixed table. Present exactly
        where the plan says the table is dynamic."""
        where = f"{field}.map"
        if spec.dynamic is None:
            if raw.get("map") is not None:
                raise self.fail(where, raw["map"], "is given for a table the plan says is fixed")
            return None
        stems = self.get(raw, "map", dict, where)
        wanted = [w for w in MAP_FILES if w != "candidates" or candidate_rows(spec.dynamic, 1)]
        if sorted(stems) != sorted(wanted):
            raise self.fail(where, sorted(stems), f"must name the files {wanted}")
        for what in wanted:
            self.stem(f"{where}.{what}", self.get(stems, what, str, f"{where}.{what}"))
        return SavedMap(dict(stems), spec.dynamic)

    def stem(self, field, stem) -> str:
        if not _FILE_STEM.fullmatch(stem):
            raise self.fail(
                field,
                stem,
                "must be a relative path of plain "
                "names (letters, digits, _ and -) inside the checkpoint",
            )
        inside(self.root, stem, what=f"file of {field}")
        return stem

    def parts(self, field, raw) -> tuple:
        parts = []
        for k, p in enumerate(self.get(raw, "parts", list, f"{field}.parts")):
            where = f"{field}.parts[{k}]"
            stem = self.stem(f"{where}.file", self.get(p, "file", str, f"{where}.file"))
            parts.append(
                Part(
                    self.get(p, "name", str, f"{where}.name"),
                    stem,
                    self.dtype(p, "dtype", f"{where}.dtype"),
                    self.get(p, "per_row", bool, f"{where}.per_row") if "per_row" in p else False,
                    p["dtype"],
                )
            )
        names = [p.name for p in parts]
        if not names or names[0] != "table" or len(set(names)) != len(names):
            raise self.fail(f"{field}.parts", names, "must start with 'table' and be unique")
        return tuple(parts)

    def dense(self, i, raw) -> SavedDense:
        field = f"dense[{i}]"
        slots = tuple(
            (
                self.get(s, "name", str, f"{field}.slots[{k}].name"),
                self.shape(s, "shape", f"{field}.slots[{k}].shape"),
                self.dtype(s, "dtype", f"{field}.slots[{k}].dtype"),
            )
            for k, s in enumerate(self.get(raw, "slots", list, f"{field}.slots"))
        )
        return SavedDense(
            self.shape(raw, "shape", f"{field}.shape"),
            self.dtype(raw, "dtype", f"{field}.dtype"),
            slots,
        )


def check_plan(plan: ShardingPlan, path: str, field: str = "plan") -> None:
    """Checks that a saved plan's stored shards tile each table exactly, on valid ranks.

    Raises:
        StorageError: naming the manifest, the table and the shard.
    """
    names = [t.name for t in plan.tables]
    if len(set(names)) != len(names):
        raise StorageError(
            f"Malformed checkpoint manifest {path}: {field} names a table "
            f"twice. Received: tables={names}"
        )
    for table in plan.tables:
        shards = plan.stored_shards_of(table.name)
        for s in shards:
            if not (
                0 <= s.rank < plan.world_size
                and 0 <= s.row_start
                and s.row_start + s.rows <= table.rows
                and 0 <= s.col_start
                and s.col_start + s.cols <= table.dim
                and s.rows > 0
                and s.cols > 0
            ):
                raise StorageError(
                    f"Malformed checkpoint manifest {path}: {field}, a shard of table "
                    f"'{table.name}' lies outside its table (rows={table.rows}, "
                    f"dim={table.dim}, world_size={plan.world_size}). Received: shard={s}"
                )
        ranks = [s.rank for s in shards]
        if len(set(ranks)) != len(ranks) or not tiles(shards, table.rows, table.dim):
            raise StorageError(
                f"Malformed checkpoint manifest {path}: {field}, the saved shards of table "
                f"'{table.name}' do not cover it exactly once (one shard per rank). "
                f"Received: shards={list(shards)}"
            )
    for s in plan.shards:
        if s.table not in names:
            raise StorageError(
                f"Malformed checkpoint manifest {path}: {field} has a shard "
                f"of an unknown table. Received: shard={s}"
            )


def tiles(shards, rows, dim) -> bool:
    """True when the rectangles (``row_start, rows, col_start, cols``, inside the table) cover
    ``rows x dim`` exactly once: their areas add up (exact integers, any size) and no two
    overlap (a sweep down the rows, each rectangle compared with the ones still open)."""
    if sum(s.rows * s.cols for s in shards) != rows * dim:
        return False
    open_: list = []  # rectangles whose rows reach past the current row_start
    for a in sorted(shards, key=lambda s: s.row_start):
        open_ = [b for b in open_ if b.row_start + b.rows > a.row_start]
        if any(
            a.col_start < b.col_start + b.cols and b.col_start < a.col_start + a.cols for b in open_
        ):
            return False
        open_.append(a)
    return True


def check_complete(path: str) -> Manifest:
    """Checks that every file the manifest of ``path`` lists exists with its size (the .npy
    headers and sizes, the arrays in ``dense.npz``): run before ``latest`` may name it.

    Raises:
        StorageError: naming the first missing or incomplete file.
    """
    manifest = read_manifest(path)
    for block in manifest.blocks:
        for table in block.plan.tables:
            for part in block.parts[table.name]:
                for s in block.plan.stored_shards_of(table.name):
                    check_array(shard_file(path, part.stem, s.rank), part.shape(s), part.dtype)
            if table.name in block.maps:
                for s in block.plan.stored_shards_of(table.name):
                    for stem, shape in block.maps[table.name].arrays(s).values():
                        check_array(shard_file(path, stem, s.rank), shape, np.int64)
    dense = os.path.join(path, DENSE)
    try:
        with zipfile.ZipFile(dense) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise StorageError(f"Checkpoint file {dense} is missing or unreadable: {exc}") from exc
    missing = sorted(f"{k}.npy" for k in manifest.dense_arrays())
    missing = [n for n in missing if n not in names]
    if missing:
        raise StorageError(
            f"Checkpoint file {dense} lacks arrays the manifest lists. "
            f"Received: missing={missing}"
        )
    return manifest


KEYMAP_PART = Part("keymap", "", np.dtype(np.int64))  # read_full_tables' name for a key map


def read_full_tables(path: str) -> dict:
    """A checkpoint's tables and slots as full arrays: ``{block: {table: {part: array}}}``;
    a dynamic table's also holds ``keymap``, its slots in row order (``[rows, 3]``: key,
    count, last step).

    Reads the files only (no TensorFlow model, no Horovod): for inspection and tests. Every
    file is checked against the manifest before any table is assembled.

    Raises:
        StorageError: naming the file that is missing, malformed or outside ``path``.
    """
    manifest = read_manifest(path)
    jobs = []
    for block in manifest.blocks:
        for table in block.plan.tables:
            for part in block.parts[table.name]:
                for s in block.plan.stored_shards_of(table.name):
                    file = shard_file(path, part.stem, s.rank)
                    check_array(file, part.shape(s), part.dtype)
                    jobs.append((block.name, table, part, s, file))
            if table.name in block.maps:
                for s in block.plan.stored_shards_of(table.name):
                    stem, shape = block.maps[table.name].arrays(s)["keymap"]
                    file = shard_file(path, stem, s.rank)
                    check_array(file, shape, np.int64)
                    jobs.append((block.name, table, KEYMAP_PART, s, file))
    out: dict = {}
    for block_name, table, part, s, file in jobs:
        parts = out.setdefault(block_name, {}).setdefault(table.name, {})
        if part.name not in parts:
            width = MAP_COLUMNS if part is KEYMAP_PART else 1 if part.per_row else table.dim
            parts[part.name] = np.zeros((table.rows, width), part.dtype)
        keymap = part is KEYMAP_PART
        first, cols = (0, MAP_COLUMNS) if keymap else part.columns(s)
        shape = (s.rows, MAP_COLUMNS) if keymap else part.shape(s)
        parts[part.name][s.row_start : s.row_start + s.rows, first : first + cols] = load_array(
            file, shape, part.dtype
        )
    for block_name, table, part, _, _ in jobs:  # assembled as stored: bfloat16 as its bits
        parts = out[block_name][table.name]
        parts[part.name] = part.from_disk(parts[part.name])  # a second call changes nothing
    return out
