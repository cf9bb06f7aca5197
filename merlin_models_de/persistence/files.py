"""The files of a sharded checkpoint: names, manifest, arrays, and the directory around them.

No TensorFlow here: this module reads and writes files only, and checks everything it reads
before anyone uses it. Layout of a checkpoint directory::

    latest                               name of the newest complete checkpoint
    ckpt-<step>[-<k>]/manifest.json      what is where (see :func:`read_manifest`)
    ckpt-<step>[-<k>]/dense.npz          dense weights, their slots, optimizer scalars (rank 0)
    ckpt-<step>[-<k>]/tables/<b>/<t>/<part>-r<rank>.npy   one saved shard per file

``<b>`` and ``<t>`` are the positions of the block and of the table in the manifest, and
``<part>`` is ``table`` or ``slot<i>``: file names never contain a table, column, block or
slot name, so no name can lead a file outside the checkpoint. The manifest records which
name each file holds, and every path read from it is resolved and must stay inside the
checkpoint; so must ``latest``.

Example:
    >>> checkpoint_name(42)
    'ckpt-000000042'
    >>> parse_name("ckpt-000000042-1")
    (42, 1)
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import uuid
import warnings
import zipfile
from dataclasses import dataclass

import numpy as np

from merlin_models_de.planner.types import ShardingPlan
from merlin_models_de.persistence.disk import write_failure

FORMAT = "merlin-models-de/2"
LATEST = "latest"
MANIFEST = "manifest.json"
DENSE = "dense.npz"
# Leftovers of interrupted saves and removals; the next successful save deletes them.
TMP_PREFIX, TRASH_PREFIX, LATEST_TMP_PREFIX = ".tmp-", ".trash-", ".latest-"
_NAME = re.compile(r"ckpt-([0-9]{9,})(?:-([0-9]+))?")
_FILE_STEM = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*")


class StorageError(ValueError):
    """A file of a checkpoint or a table export is missing, malformed or does not fit the
    model (the message names the file). The one error type of :mod:`merlin_models_de.persistence`."""


CheckpointError = StorageError  # its first name, kept: the same type


# ---- small files, written whole or not at all ---------------------------------------------------


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` so a reader sees the old file or the whole new one, also
    after a crash: write aside, flush to disk, rename over, flush the directory entry."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f"{LATEST_TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a file system without directory handles: the rename is all there is
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str, value) -> None:
    """``value`` as JSON at ``path``, atomically (:func:`write_atomic`)."""
    write_atomic(path, json.dumps(value, indent=1))


def read_json(path: str, what: str):
    """The JSON at ``path``; :class:`StorageError` naming ``what`` and the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise StorageError(f"{what} {path} is missing.") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StorageError(f"{what} {path} is not readable JSON: {exc}") from exc


# ---- names and paths --------------------------------------------------------------------------


def checkpoint_name(step: int, index: int = 0) -> str:
    """Directory name of the ``index``-th checkpoint saved for ``step`` (0: the first)."""
    return f"ckpt-{step:09d}" + (f"-{index}" if index else "")


def parse_name(name: str):
    """``(step, index)`` of a checkpoint directory name, or None for any other name."""
    match = _NAME.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(2) or 0))


def free_name(directory: str, step: int) -> str:
    """The first checkpoint name for ``step`` that nothing in ``directory`` uses yet.

    A re-saved step gets a new name, so the checkpoint ``latest`` names is never replaced in
    place (a crash mid-replacement would leave ``latest`` pointing at nothing).
    """
    index = 0
    while os.path.lexists(os.path.join(directory, checkpoint_name(step, index))):
        index += 1
    return checkpoint_name(step, index)


def part_stem(block_index: int, table_index: int, part_index: int) -> str:
    """Path (inside the checkpoint, without rank and suffix) of one part of one table."""
    part = "table" if part_index == 0 else f"slot{part_index - 1}"
    return f"tables/{block_index}/{table_index}/{part}"


def shard_file(root: str, stem: str, rank: int) -> str:
    """The file of the shard that ``rank`` saved of the part ``stem``."""
    return inside(root, f"{stem}-r{rank}.npy", what="shard file")


def inside(root: str, relative: str, what: str = "file") -> str:
    """``root/relative``, resolved (symlinks too); raises if it is not inside ``root``.

    Raises:
        CheckpointError: naming ``what`` and ``relative``.
    """
    base = os.path.realpath(root)
    path = os.path.realpath(os.path.join(base, relative))
    if os.path.isabs(relative) or os.path.commonpath([base, path]) != base or path == base:
        raise CheckpointError(f"The checkpoint {what} would lie outside the checkpoint "
                              f"directory {base}. Received: {what}={relative!r}")
    return path


# ---- latest -----------------------------------------------------------------------------------


def read_latest(directory: str) -> str | None:
    """Path of the checkpoint ``directory/latest`` names, or None without ``latest``.

    Raises:
        CheckpointError: when ``latest`` holds anything but a checkpoint name inside
            ``directory`` (an absolute path, ``..``, a symlink leading out).
    """
    pointer = os.path.join(directory, LATEST)
    if not os.path.isfile(pointer):
        return None
    try:
        with open(pointer, encoding="utf-8") as f:
            name = f.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"Cannot read the checkpoint pointer {pointer}: {exc}") from exc
    if parse_name(name) is None:
        raise CheckpointError(f"The checkpoint pointer {pointer} must hold the name of a "
                              f"checkpoint directory next to it (ckpt-<step>). "
                              f"Received: latest={name!r}")
    try:
        return inside(directory, name, what="latest")
    except CheckpointError as exc:
        raise CheckpointError(f"The checkpoint pointer {pointer} leads outside {directory}. "
                              f"Received: latest={name!r}") from exc


def write_latest(directory: str, name: str) -> None:
    """Points ``directory/latest`` at ``name`` atomically (write aside, flush, rename)."""
    write_atomic(os.path.join(directory, LATEST), name + "\n")


# ---- arrays -----------------------------------------------------------------------------------


class _Writer:
    """A file seen by NumPy as a plain stream: it then writes through Python, whose errors
    keep their errno (its own C writes report a full disk as "N requested and M written")."""

    def __init__(self, f):
        self.write = f.write


def write_array(path: str, array) -> None:
    """Saves one array as ``.npy`` (never pickled), creating its directory.

    Raises:
        OSError: naming the file, the rank and the cause (``No space left on device``).
    """
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            np.lib.format.write_array(_Writer(f), _c_order(array), allow_pickle=False)
    except OSError as exc:
        raise write_failure(path, exc) from exc


def _c_order(array) -> np.ndarray:
    # np.ascontiguousarray would turn a scalar into shape (1,)
    return np.array(array, order="C", copy=False)


def check_array(path: str, shape, dtype) -> None:
    """Checks that ``path`` is a ``.npy`` file holding exactly a ``dtype`` array of ``shape``.

    Reads the header only; the size check catches truncated and padded files.

    Raises:
        CheckpointError: naming the file and what differs.
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                found_shape, fortran, found_dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                found_shape, fortran, found_dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = f.tell()
    except FileNotFoundError as exc:
        raise CheckpointError(f"Checkpoint file {path} is missing.") from exc
    except (OSError, ValueError, EOFError, SyntaxError) as exc:
        raise CheckpointError(f"Checkpoint file {path} is not a readable .npy array: "
                              f"{exc}") from exc
    want = (tuple(int(n) for n in shape), np.dtype(dtype))
    if (tuple(found_shape), found_dtype) != want or fortran:
        raise CheckpointError(
            f"Checkpoint file {path} does not hold what the manifest says: expected "
            f"{want[1]} {want[0]}. Received: dtype={found_dtype}, shape={tuple(found_shape)}"
            f"{', fortran_order=True' if fortran else ''}")
    expected = offset + math.prod(want[0]) * want[1].itemsize
    size = os.path.getsize(path)
    if size != expected:
        raise CheckpointError(f"Checkpoint file {path} is truncated or has trailing bytes: "
                              f"expected {expected} bytes. Received: size={size}")


def load_array(path: str, shape, dtype):
    """A read-only memory map of a checked ``.npy`` file (nothing is read until sliced)."""
    check_array(path, shape, dtype)
    if math.prod(shape) == 0:  # an empty file region cannot be mapped
        return np.zeros(shape, dtype)
    return np.load(path, mmap_mode="r", allow_pickle=False)


def write_arrays(path: str, arrays: dict) -> None:
    """Saves ``{key: array}`` as an uncompressed ``.npz`` whose members are never pickled.

    Raises:
        OSError: naming the file, the rank and the cause.
    """
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, value in arrays.items():
                with archive.open(f"{key}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, _c_order(value), allow_pickle=False)
    except OSError as exc:
        raise write_failure(path, exc) from exc


def read_arrays(path: str, expected: dict) -> dict:
    """Reads a ``.npz`` holding exactly ``expected`` = ``{key: (shape, dtype)}``.

    Raises:
        CheckpointError: naming the file, and the key that is missing, extra or different.
    """
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, not an .npz archive")
        with archive:
            keys = set(archive.files)
            if keys != set(expected):
                missing, extra = sorted(set(expected) - keys), sorted(keys - set(expected))
                raise CheckpointError(f"Checkpoint file {path} does not hold the arrays the "
                                      f"manifest lists. Received: missing={missing}, "
                                      f"unexpected={extra}")
            arrays = {key: archive[key] for key in sorted(keys)}
    except CheckpointError:
        raise
    except FileNotFoundError as exc:
        raise CheckpointError(f"Checkpoint file {path} is missing.") from exc
    except (OSError, ValueError, EOFError, TypeError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"Checkpoint file {path} is not a readable .npz archive: "
                              f"{exc}") from exc
    for key, (shape, dtype) in expected.items():
        got = arrays[key]
        if got.shape != tuple(shape) or got.dtype != np.dtype(dtype):
            raise CheckpointError(
                f"Checkpoint file {path}, array '{key}' does not hold what the manifest says: "
                f"expected {np.dtype(dtype)} {tuple(shape)}. Received: dtype={got.dtype}, "
                f"shape={got.shape}")
    return arrays


# ---- manifest ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One saved array per shard of a table: the table itself or one optimizer slot."""

    name: str  # "table" or the slot's name
    stem: str  # file path inside the checkpoint, without "-r<rank>.npy"
    dtype: np.dtype


@dataclass(frozen=True)
class SavedBlock:
    """One embedding block of a checkpoint."""

    name: str
    plan: ShardingPlan
    parts: dict  # table name -> tuple of Part, "table" first


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
        CheckpointError: naming the manifest and the offending field and value.
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
        return CheckpointError(f"Malformed checkpoint manifest {self.path}: {field} {why}. "
                               f"Received: {field}={text}")

    def get(self, obj, key, kind, field):
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(field, obj if not isinstance(obj, dict) else None,
                            "is missing")
        value = obj[key]
        ok = (isinstance(value, kind) and not (kind is int and isinstance(value, bool)))
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
            dtype = np.dtype(text)
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
        state = tuple((self.get(s, "name", str, f"state[{j}].name"),
                       self.shape(s, "shape", f"state[{j}].shape"),
                       self.dtype(s, "dtype", f"state[{j}].dtype"))
                      for j, s in enumerate(self.get(raw, "state", list, "state")))
        blocks = tuple(self.block(i, b) for i, b in enumerate(self.get(raw, "blocks", list,
                                                                       "blocks")))
        names = [b.name for b in blocks]
        if len(set(names)) != len(names):
            raise self.fail("blocks", names, "must have unique names")
        dense = tuple(self.dense(i, d) for i, d in enumerate(self.get(raw, "dense", list,
                                                                      "dense")))
        return Manifest(self.path, self.count(raw, "step", "step"),
                        self.count(raw, "sequence", "sequence", 1),
                        self.count(raw, "world_size", "world_size", 1), optimizer, state,
                        blocks, dense, raw)

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
        if [self.get(t, "name", str, f"{field}.tables.name") for t in tables] != \
                [t.name for t in plan.tables]:
            raise self.fail(f"{field}.tables", [t.get("name") for t in tables],
                            "must name the plan's tables in the plan's order")
        parts = {t["name"]: self.parts(f"{field}.tables[{j}]", t) for j, t in enumerate(tables)}
        return SavedBlock(name, plan, parts)

    def parts(self, field, raw) -> tuple:
        parts = []
        for k, p in enumerate(self.get(raw, "parts", list, f"{field}.parts")):
            where = f"{field}.parts[{k}]"
            stem = self.get(p, "file", str, f"{where}.file")
            if not _FILE_STEM.fullmatch(stem):
                raise self.fail(f"{where}.file", stem, "must be a relative path of plain "
                                "names (letters, digits, _ and -) inside the checkpoint")
            inside(self.root, stem, what=f"file of {where}")
            parts.append(Part(self.get(p, "name", str, f"{where}.name"), stem,
                              self.dtype(p, "dtype", f"{where}.dtype")))
        names = [p.name for p in parts]
        if not names or names[0] != "table" or len(set(names)) != len(names):
            raise self.fail(f"{field}.parts", names, "must start with 'table' and be unique")
        return tuple(parts)

    def dense(self, i, raw) -> SavedDense:
        field = f"dense[{i}]"
        slots = tuple((self.get(s, "name", str, f"{field}.slots[{k}].name"),
                       self.shape(s, "shape", f"{field}.slots[{k}].shape"),
                       self.dtype(s, "dtype", f"{field}.slots[{k}].dtype"))
                      for k, s in enumerate(self.get(raw, "slots", list, f"{field}.slots")))
        return SavedDense(self.shape(raw, "shape", f"{field}.shape"),
                          self.dtype(raw, "dtype", f"{field}.dtype"), slots)


def check_plan(plan: ShardingPlan, path: str, field: str = "plan") -> None:
    """Checks that a saved plan's stored shards tile each table exactly, on valid ranks.

    Raises:
        CheckpointError: naming the manifest, the table and the shard.
    """
    names = [t.name for t in plan.tables]
    if len(set(names)) != len(names):
        raise CheckpointError(f"Malformed checkpoint manifest {path}: {field} names a table "
                              f"twice. Received: tables={names}")
    for table in plan.tables:
        shards = plan.stored_shards_of(table.name)
        for s in shards:
            if not (0 <= s.rank < plan.world_size and 0 <= s.row_start
                    and s.row_start + s.rows <= table.rows and 0 <= s.col_start
                    and s.col_start + s.cols <= table.dim and s.rows > 0 and s.cols > 0):
                raise CheckpointError(
                    f"Malformed checkpoint manifest {path}: {field}, a shard of table "
                    f"'{table.name}' lies outside its table (rows={table.rows}, "
                    f"dim={table.dim}, world_size={plan.world_size}). Received: shard={s}")
        ranks = [s.rank for s in shards]
        if len(set(ranks)) != len(ranks) or not tiles(shards, table.rows, table.dim):
            raise CheckpointError(
                f"Malformed checkpoint manifest {path}: {field}, the saved shards of table "
                f"'{table.name}' do not cover it exactly once (one shard per rank). "
                f"Received: shards={list(shards)}")
    for s in plan.shards:
        if s.table not in names:
            raise CheckpointError(f"Malformed checkpoint manifest {path}: {field} has a shard "
                                  f"of an unknown table. Received: shard={s}")


def tiles(shards, rows, dim) -> bool:
    """True when the rectangles (``row_start, rows, col_start, cols``, inside the table) cover
    ``rows x dim`` exactly once: their areas add up (exact integers, any size) and no two
    overlap (a sweep down the rows, each rectangle compared with the ones still open)."""
    if sum(s.rows * s.cols for s in shards) != rows * dim:
        return False
    open_ = []  # rectangles whose rows reach past the current row_start
    for a in sorted(shards, key=lambda s: s.row_start):
        open_ = [b for b in open_ if b.row_start + b.rows > a.row_start]
        if any(a.col_start < b.col_start + b.cols and b.col_start < a.col_start + a.cols
               for b in open_):
            return False
        open_.append(a)
    return True


# ---- the directory: complete checkpoints, retention, leftovers -------------------------------


@dataclass(frozen=True)
class Entry:
    """A complete checkpoint in a directory."""

    name: str
    step: int
    sequence: int


def complete_checkpoints(directory: str) -> list:
    """The complete checkpoints in ``directory`` (a manifest of this format with a save
    sequence number), oldest save first. Anything else is left alone by retention."""
    out = []
    for name in os.listdir(directory):
        parsed = parse_name(name)
        path = os.path.join(directory, name)
        if parsed is None or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
                raw = json.load(f)
            sequence = raw["sequence"] if raw.get("format") == FORMAT else None
        except (OSError, ValueError, AttributeError, KeyError):
            continue
        if isinstance(sequence, int) and not isinstance(sequence, bool):
            out.append(Entry(name, parsed[0], sequence))
    return sorted(out, key=lambda e: (e.sequence, e.step, e.name))


def next_sequence(directory: str) -> int:
    """Save number for a new checkpoint: one more than any complete one in ``directory``."""
    return 1 + max((e.sequence for e in complete_checkpoints(directory)), default=0)


def remove_checkpoint_dir(path: str) -> None:
    """Removes a directory in two steps: an atomic rename out of the ``ckpt-*`` names, then
    the deletion; a crash in between leaves a ``.trash-*`` leftover, never half a checkpoint."""
    trash = os.path.join(os.path.dirname(path), f"{TRASH_PREFIX}{uuid.uuid4().hex}")
    os.rename(path, trash)
    shutil.rmtree(trash)


def leftovers(directory: str) -> list:
    """Names of the temporaries in ``directory`` (interrupted saves and removals). Listed by
    a writer when it takes the directory's lock: their writers no longer hold it."""
    prefixes = (TMP_PREFIX, TRASH_PREFIX, LATEST_TMP_PREFIX)
    return sorted(n for n in os.listdir(directory) if n.startswith(prefixes))


def prune(directory: str, current: str, keep: int | None, stale=()) -> None:
    """Removes what the checkpoint ``current`` (which ``latest`` names) makes obsolete.

    Other checkpoints of the same step (superseded by ``current``), with ``keep`` the complete
    checkpoints beyond the ``keep`` newest saves, and the temporaries named in ``stale``
    (:func:`leftovers` of writers gone before this one took the lock) -- never a temporary
    that appeared since: it may be another writer's save in progress. Best effort: a failure
    warns, and the next save tries again.
    """
    entries = complete_checkpoints(directory)
    step = parse_name(current)[0]
    doomed = [e for e in entries if e.step == step and e.name != current]
    if keep is not None:
        newest_first = [e for e in reversed(entries) if e not in doomed]
        doomed += [e for e in newest_first[keep:] if e.name != current]
    for entry in doomed:
        _try(remove_checkpoint_dir, os.path.join(directory, entry.name))
    for name in stale:
        path = os.path.join(directory, name)
        if not os.path.lexists(path):
            continue
        if name.startswith((TMP_PREFIX, TRASH_PREFIX)) and not os.path.islink(path) \
                and os.path.isdir(path):
            _try(shutil.rmtree, path)
        else:
            _try(os.remove, path)


def _try(action, path) -> None:
    try:
        action(path)
    except OSError as exc:
        warnings.warn(f"Could not remove {path} ({exc}); the next checkpoint save retries.",
                      RuntimeWarning, stacklevel=3)


def check_complete(path: str) -> Manifest:
    """Checks that every file the manifest of ``path`` lists exists with its size (the .npy
    headers and sizes, the arrays in ``dense.npz``): run before ``latest`` may name it.

    Raises:
        CheckpointError: naming the first missing or incomplete file.
    """
    manifest = read_manifest(path)
    for block in manifest.blocks:
        for table in block.plan.tables:
            for part in block.parts[table.name]:
                for s in block.plan.stored_shards_of(table.name):
                    check_array(shard_file(path, part.stem, s.rank), (s.rows, s.cols),
                                part.dtype)
    dense = os.path.join(path, DENSE)
    try:
        with zipfile.ZipFile(dense) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"Checkpoint file {dense} is missing or unreadable: {exc}") from exc
    missing = sorted(f"{k}.npy" for k in manifest.dense_arrays())
    missing = [n for n in missing if n not in names]
    if missing:
        raise CheckpointError(f"Checkpoint file {dense} lacks arrays the manifest lists. "
                              f"Received: missing={missing}")
    return manifest


# ---- reading a whole checkpoint ---------------------------------------------------------------


def read_full_tables(path: str) -> dict:
    """A checkpoint's tables and slots as full arrays: ``{block: {table: {part: array}}}``.

    Reads the files only (no TensorFlow model, no Horovod): for inspection and tests. Every
    file is checked against the manifest before any table is assembled.

    Raises:
        CheckpointError: naming the file that is missing, malformed or outside ``path``.
    """
    manifest = read_manifest(path)
    jobs = []
    for block in manifest.blocks:
        for table in block.plan.tables:
            for part in block.parts[table.name]:
                for s in block.plan.stored_shards_of(table.name):
                    file = shard_file(path, part.stem, s.rank)
                    check_array(file, (s.rows, s.cols), part.dtype)
                    jobs.append((block.name, table, part, s, file))
    out: dict = {}
    for block_name, table, part, s, file in jobs:
        parts = out.setdefault(block_name, {}).setdefault(table.name, {})
        if part.name not in parts:
            parts[part.name] = np.zeros((table.rows, table.dim), part.dtype)
        data = load_array(file, (s.rows, s.cols), part.dtype)
        parts[part.name][s.row_start:s.row_start + s.rows, s.col_start:s.col_start + s.cols] = data
    return out
