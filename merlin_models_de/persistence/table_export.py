"""One table of a block written to files by every rank in parallel, and read back.

For catalogs too large for one host's memory (the item table of a retrieval model, to index
for serving): each rank writes the rows (or row x column rectangle) it holds, nobody gathers
the table. Rank 0 then writes ``manifest.json``; a reader assembles the whole table or
streams it in row batches from memory maps, never holding more than one batch.

Layout of ``directory``::

    manifest.json   {"format": "mmde-table/1", "table", "rows", "dim", "dtype",
                     "parts": [{"file", "row_start", "rows", "col_start", "cols"}, ...],
                     "keys": [{"file", "count"}, ...]}  (a dynamic table only)
    part-00000.npy  one rectangle of the table each (file names never come from table names)
    keys-00000.npy  a dynamic table's ``[count, 2]`` int64 (key, row) of the rows that hold
                    a key, one file a rank (:func:`read_keys`); its other rows are empty

An export is written whole beside the old one (``.tmp-<id>-<name>`` in the same parent),
flushed to disk, and put in its place in one step; the old one is then deleted. No file is
ever rewritten in place, so a reader sees one export: it reads the manifest and every part
through one handle of the directory, and the parts it has mapped stay readable after a new
export replaced them. A reader that opened the old export and finds a part gone raises,
naming the file. The directory belongs to the export: anything else in it is refused.

Example:
    >>> export_table(block, "item_id", "/data/items")  # every rank calls it  # doctest: +SKIP
    >>> for first_row, vectors in iter_table("/data/items", batch_rows=100_000):
    ...     index.add(vectors)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from merlin_models_de.persistence.io import (
    StorageError,
    beside,
    disk_dtype,
    from_disk,
    fsync_directories,
    fsync_directory,
    load_array,
    open_directory,
    read_json,
    remove_path,
    replace_whole,
    to_disk,
    write_array,
    write_json,
)
from merlin_models_de.persistence.manifest import tiles
from merlin_models_de.persistence.state import dtype_name
from merlin_models_de.runtime import agree

FORMAT = "mmde-table/1"
MANIFEST = "manifest.json"
_PART = re.compile(r"(part|keys)-[0-9]{5,}\.npy")
_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def _part_name(index: int) -> str:
    return f"part-{index:05d}.npy"


def _keys_name(index: int) -> str:
    return f"keys-{index:05d}.npy"


def export_table(block, table: str, directory: str) -> str:
    """Collective: writes ``table`` of ``block`` to ``directory`` (see the module doc).
    ``table``: a table's name or a feature's (its table), as ``block[...]`` takes them.

    Every rank writes its own rectangles of the table; a write that fails on any rank
    raises on every rank, naming the rank and its error, and leaves the previous export (if
    any) as it was. Returns ``directory``.
    """
    if table not in block:  # the same on every rank: no collective needed to agree
        raise ValueError(
            f"Block '{block.name}' has no table {table!r}. Tables: "
            f"{[t.name for t in block.tables]}; features: "
            f"{[f.name for f in block.features]}"
        )
    table = block[table].name  # a feature names its table, as in block[...]
    block.ensure_built()
    shards = block.plan.stored_shards_of(table)
    spec = block.plan.table(table)
    # a 16-bit table is exported in 16 bits
    dtype_label = dtype_name(block.backend.storage_dtype(table))
    what = f"exporting table '{table}' to {directory}"
    rank0 = block.rank == 0

    def prepare():
        if rank0:
            _check_replaceable(directory)
            os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
            return beside(directory)
        return None

    keymap = getattr(block.backend, "keymaps", {}).get(table)

    def write_parts(tmp):
        written, keyed = [], None
        for index, shard in enumerate(shards):
            if shard.rank == block.rank:
                var, first = block.backend.shard_variable(shard)
                written.append(os.path.join(tmp, _part_name(index)))
                write_array(written[-1], to_disk(var[first : first + shard.rows].numpy()))
                if keymap is not None:  # one share a rank: its slots are its rows
                    pairs = _keyed_rows(keymap, shard.row_start)
                    written.append(os.path.join(tmp, _keys_name(block.rank)))
                    write_array(written[-1], pairs)
                    keyed = len(pairs)
        fsync_directories(tmp, written)
        return keyed

    def publish(tmp, aside, keyed):
        os.makedirs(tmp, exist_ok=True)  # a table with no rows has no parts
        keys = [
            {"file": _keys_name(rank), "count": count}
            for rank, count in enumerate(keyed)
            if count is not None
        ]
        write_json(
            os.path.join(tmp, MANIFEST),
            {
                "format": FORMAT,
                "table": table,
                "rows": spec.rows,
                "dim": spec.dim,
                "dtype": dtype_label,
                "parts": [
                    {
                        "file": _part_name(i),
                        "row_start": s.row_start,
                        "rows": s.rows,
                        "col_start": s.col_start,
                        "cols": s.cols,
                    }
                    for i, s in enumerate(shards)
                ],
                **({"keys": keys} if keymap is not None else {}),
            },
        )
        fsync_directory(tmp)  # the parts' entries, whichever rank wrote them
        replace_whole(tmp, directory, aside)

    _, names = agree.on_every_rank(
        what, prepare, share=lambda n: n, error_type=StorageError, wrap_own=True
    )
    tmp, aside = names[0]
    try:
        _, keyed = agree.on_every_rank(
            what, lambda: write_parts(tmp), share=lambda n: n, error_type=OSError, wrap_own=True
        )
        agree.on_rank_zero(what, lambda: publish(tmp, aside, keyed), error_type=OSError)
    except Exception:
        if rank0:  # every rank is past its writes (the stages agree)
            remove_path(tmp)
        raise
    return directory


def _keyed_rows(keymap, row_start: int) -> np.ndarray:
    """``[n, 2]`` int64 (key, row of the table) of this rank's slots that hold a key."""
    used = np.flatnonzero(keymap.table.counts.numpy() > 0)
    keys = keymap.table.keys.numpy()[used]
    return np.stack([keys, used.astype(np.int64) + row_start], axis=1).astype(np.int64)


def _check_replaceable(directory: str) -> None:
    """Raises unless ``directory`` is missing, empty, or holds an export (nothing else is
    deleted by the export that replaces it)."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise StorageError(
            f"Cannot export a table to {directory}: it is not a directory. "
            f"Received: directory={directory!r}"
        )
    foreign = sorted(n for n in os.listdir(directory) if n != MANIFEST and not _PART.fullmatch(n))
    if foreign:
        raise StorageError(
            f"Cannot export a table to {directory}: it holds files that are not part of a "
            f"table export ({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}), "
            f"and an export replaces its directory whole. Export into a new or empty "
            f"directory. Received: directory={directory!r}"
        )


def read_manifest(directory: str) -> dict:
    """The export's manifest, checked: format, field types, shape, and parts that tile the
    table exactly (arithmetic on the parts' rectangles, for tables of any size).

    Raises:
        StorageError: naming the manifest, the field and the value received.
    """
    fd = open_directory(directory, "table export")
    try:
        return _read_manifest(directory, fd)
    finally:
        os.close(fd)


def _read_manifest(directory: str, fd: int) -> dict:
    path = os.path.join(directory, MANIFEST)
    try:
        manifest = read_json(path, "Table export manifest", dir_fd=fd)
    except StorageError as exc:
        if not os.path.lexists(path):
            raise StorageError(f"No table export in {directory}: {path} is missing.") from exc
        raise

    def fail(why):
        return StorageError(f"Table export manifest {path} is damaged: {why}")

    def field(obj, key, kind, where, low=None):
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise fail(
                f"{where}{key} must be of type {kind.__name__}. "
                f"Received: {where}{key}={value!r}"
            )
        if low is not None and value < low:
            raise fail(f"{where}{key} must be >= {low}. Received: {where}{key}={value!r}")
        return value

    if field(manifest, "format", str, "") != FORMAT:
        raise fail(f"format {manifest['format']!r}, expected {FORMAT!r}")
    rows, dim = field(manifest, "rows", int, "", 0), field(manifest, "dim", int, "", 0)
    try:
        dtype = disk_dtype(field(manifest, "dtype", str, ""))
    except TypeError as exc:
        raise fail(f"dtype is not a dtype. Received: dtype={manifest['dtype']!r}") from exc
    if dtype.kind not in "biuf":
        raise fail(f"dtype must be numeric. Received: dtype={manifest['dtype']!r}")
    rectangles = []
    for i, part in enumerate(field(manifest, "parts", list, "")):
        where = f"parts[{i}]."
        if not _FILE_NAME.fullmatch(field(part, "file", str, where)):
            raise fail(
                f"{where}file must be a file name in the export directory (no path "
                f"to anywhere outside it). Received: {where}file={part['file']!r}"
            )
        r0, nr, c0, nc = (
            field(part, k, int, where, 0) for k in ("row_start", "rows", "col_start", "cols")
        )
        if r0 + nr > rows or c0 + nc > dim:
            raise fail(
                f"part {part['file']!r} lies outside the {rows} x {dim} table. Received: {part}"
            )
        if nr and nc:
            rectangles.append(_Rectangle(r0, nr, c0, nc))
    if not tiles(rectangles, rows, dim):
        raise fail(
            f"its parts do not cover the table ({rows} x {dim}) exactly once. "
            f"Received: parts={manifest['parts']}"
        )
    return manifest


@dataclass(frozen=True)
class _Rectangle:
    row_start: int
    rows: int
    col_start: int
    cols: int


def _open_export(directory: str):
    """``(manifest, [(part, memory map)])`` of one export: the manifest and every part read
    through one handle of the directory (see the module doc)."""
    fd = open_directory(directory, "table export")
    try:
        manifest = _read_manifest(directory, fd)
        dtype = disk_dtype(manifest["dtype"])
        parts = []
        for part in manifest["parts"]:
            path = os.path.join(directory, part["file"])
            try:
                parts.append(
                    (part, load_array(path, (part["rows"], part["cols"]), dtype, dir_fd=fd))
                )
            except StorageError as exc:
                if _replaced(directory, fd):
                    raise StorageError(
                        f"Table export {directory} was replaced while it was being read: its "
                        f"part {path} is gone. Read it again (the new export is whole)."
                    ) from exc
                raise
        return manifest, parts
    finally:
        os.close(fd)


def _replaced(directory: str, fd: int) -> bool:
    """True when ``directory`` is no longer the directory opened as ``fd``."""
    try:
        now, then = os.stat(directory), os.fstat(fd)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (then.st_dev, then.st_ino)


def iter_table(directory: str, batch_rows: int = 65536):
    """Yields ``(first_row, vectors [n, dim])`` for consecutive row batches of the exported
    table; at most one batch is in memory (the parts are memory-mapped)."""
    if not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be a positive int. Received: {batch_rows!r}")
    manifest, parts = _open_export(directory)
    rows, dim = manifest["rows"], manifest["dim"]
    for start in range(0, rows, batch_rows):
        stop = min(start + batch_rows, rows)
        batch = np.zeros((stop - start, dim), disk_dtype(manifest["dtype"]))
        for part, array in parts:
            lo, hi = max(start, part["row_start"]), min(stop, part["row_start"] + part["rows"])
            if lo < hi:
                batch[
                    lo - start : hi - start, part["col_start"] : part["col_start"] + part["cols"]
                ] = array[lo - part["row_start"] : hi - part["row_start"]]
        yield start, from_disk(batch, manifest["dtype"])


def read_keys(directory: str) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)`` of an exported dynamic table, sorted by key: each key that held a
    row and that row's index in the table (:func:`read_table`, :func:`iter_table`).

    Raises:
        StorageError: naming the directory when its table is not a dynamic table.
    """
    fd = open_directory(directory, "table export")
    try:
        manifest = _read_manifest(directory, fd)
        if "keys" not in manifest:
            raise StorageError(
                f"Table export {directory} (table {manifest['table']!r}) holds no keys: "
                "only a dynamic table's export has them"
            )
        pairs = [
            np.asarray(
                load_array(os.path.join(directory, k["file"]), (k["count"], 2), np.int64, dir_fd=fd)
            )
            for k in manifest["keys"]
        ]
    finally:
        os.close(fd)
    both = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)
    order = np.argsort(both[:, 0], kind="stable")
    return both[order, 0], both[order, 1]


def read_table(directory: str) -> np.ndarray:
    """The whole exported table as one array (for tables that fit in memory)."""
    manifest, parts = _open_export(directory)
    table = np.zeros((manifest["rows"], manifest["dim"]), disk_dtype(manifest["dtype"]))
    for part, array in parts:
        table[
            part["row_start"] : part["row_start"] + part["rows"],
            part["col_start"] : part["col_start"] + part["cols"],
        ] = array
    return from_disk(table, manifest["dtype"])


__all__ = ["export_table", "iter_table", "read_keys", "read_manifest", "read_table"]
