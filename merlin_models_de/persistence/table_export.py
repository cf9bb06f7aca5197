"""One table of a block written to files by every rank in parallel, and read back.

For catalogs too large for one host's memory (the item table of a retrieval model, to index
for serving): each rank writes the rows (or row x column rectangle) it holds, nobody gathers
the table. Rank 0 then writes ``manifest.json``; a reader assembles the whole table or
streams it in row batches from memory maps, never holding more than one batch.

Layout of ``directory``::

    manifest.json   {"format": "mmde-table/1", "table", "rows", "dim", "dtype",
                     "parts": [{"file", "row_start", "rows", "col_start", "cols"}, ...]}
    part-00000.npy  one rectangle of the table each (file names never come from table names)

Example:
    >>> export_table(block, "item_id", "/data/items")  # every rank calls it  # doctest: +SKIP
    >>> for first_row, vectors in iter_table("/data/items", batch_rows=100_000):
    ...     index.add(vectors)  # doctest: +SKIP
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from merlin_models_de.runtime import agree
from merlin_models_de.persistence.files import (StorageError, inside, load_array, read_json,
                                                tiles, write_array, write_json)

FORMAT = "mmde-table/1"
MANIFEST = "manifest.json"


def _part_name(index: int) -> str:
    return f"part-{index:05d}.npy"


def export_table(block, table: str, directory: str) -> str:
    """Collective: writes ``table`` of ``block`` to ``directory`` (see the module doc).

    Every rank writes its own rectangles of the table; a write that fails on any rank
    raises on every rank, naming the rank and its error, and no manifest is written (a
    previous export's manifest is removed first, so a half-written export is never read).
    Returns ``directory``.
    """
    names = [t.name for t in block.tables]
    if table not in names:  # the same on every rank: no collective needed to agree
        raise ValueError(f"Block '{block.name}' has no table {table!r}. Tables: {names}")
    block._ensure_built()  # pylint: disable=protected-access
    shards = block.plan.stored_shards_of(table)
    spec = block.plan.table(table)
    dtype = np.dtype(block.backend.dtype.as_numpy_dtype)
    what = f"exporting table '{table}' to {directory}"

    def write_parts():
        os.makedirs(directory, exist_ok=True)
        if block.rank == 0 and os.path.exists(os.path.join(directory, MANIFEST)):
            os.remove(os.path.join(directory, MANIFEST))
        for index, shard in enumerate(shards):
            if shard.rank == block.rank:
                var, first = block.backend.shard_variable(shard)
                write_array(inside(directory, _part_name(index), "table part"),
                            var[first:first + shard.rows].numpy())

    def write_manifest():
        manifest = {"format": FORMAT, "table": table, "rows": spec.rows, "dim": spec.dim,
                    "dtype": dtype.name,
                    "parts": [{"file": _part_name(i), "row_start": s.row_start, "rows": s.rows,
                               "col_start": s.col_start, "cols": s.cols}
                              for i, s in enumerate(shards)]}
        write_json(os.path.join(directory, MANIFEST), manifest)

    agree.on_every_rank(what, write_parts, error_type=OSError, wrap_own=True)
    agree.on_rank_zero(what, write_manifest, error_type=OSError)
    return directory


def read_manifest(directory: str) -> dict:
    """The export's manifest, checked: format, field types, shape, and parts that tile the
    table exactly (arithmetic on the parts' rectangles, for tables of any size).

    Raises:
        StorageError: naming the manifest, the field and the value received.
    """
    path = os.path.join(directory, MANIFEST)
    try:
        manifest = read_json(path, "Table export manifest")
    except StorageError as exc:
        if not os.path.exists(path):
            raise StorageError(f"No table export in {directory}: {path} is missing.") from exc
        raise

    def fail(why):
        return StorageError(f"Table export manifest {path} is damaged: {why}")

    def field(obj, key, kind, where, low=None):
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise fail(f"{where}{key} must be of type {kind.__name__}. "
                       f"Received: {where}{key}={value!r}")
        if low is not None and value < low:
            raise fail(f"{where}{key} must be >= {low}. Received: {where}{key}={value!r}")
        return value

    if field(manifest, "format", str, "") != FORMAT:
        raise fail(f"format {manifest['format']!r}, expected {FORMAT!r}")
    rows, dim = field(manifest, "rows", int, "", 0), field(manifest, "dim", int, "", 0)
    try:
        dtype = np.dtype(field(manifest, "dtype", str, ""))
    except TypeError as exc:
        raise fail(f"dtype is not a dtype. Received: dtype={manifest['dtype']!r}") from exc
    if dtype.kind not in "biuf":
        raise fail(f"dtype must be numeric. Received: dtype={manifest['dtype']!r}")
    rectangles = []
    for i, part in enumerate(field(manifest, "parts", list, "")):
        where = f"parts[{i}]."
        field(part, "file", str, where)
        r0, nr, c0, nc = (field(part, k, int, where, 0)
                          for k in ("row_start", "rows", "col_start", "cols"))
        if r0 + nr > rows or c0 + nc > dim:
            raise fail(f"part {part['file']!r} lies outside the {rows} x {dim} table. "
                       f"Received: {part}")
        if nr and nc:
            rectangles.append(_Rectangle(r0, nr, c0, nc))
    if not tiles(rectangles, rows, dim):
        raise fail(f"its parts do not cover the table ({rows} x {dim}) exactly once. "
                   f"Received: parts={manifest['parts']}")
    return manifest


@dataclass(frozen=True)
class _Rectangle:
    row_start: int
    rows: int
    col_start: int
    cols: int


def _parts(directory: str, manifest: dict):
    dtype = np.dtype(manifest["dtype"])
    for part in manifest["parts"]:
        path = inside(directory, part["file"], "table part")
        yield part, load_array(path, (part["rows"], part["cols"]), dtype)


def iter_table(directory: str, batch_rows: int = 65536):
    """Yields ``(first_row, vectors [n, dim])`` for consecutive row batches of the exported
    table; at most one batch is in memory (the parts are memory-mapped)."""
    if not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be a positive int. Received: {batch_rows!r}")
    manifest = read_manifest(directory)
    parts = list(_parts(directory, manifest))
    rows, dim = manifest["rows"], manifest["dim"]
    for start in range(0, rows, batch_rows):
        stop = min(start + batch_rows, rows)
        batch = np.zeros((stop - start, dim), manifest["dtype"])
        for part, array in parts:
            lo, hi = max(start, part["row_start"]), min(stop, part["row_start"] + part["rows"])
            if lo < hi:
                batch[lo - start:hi - start, part["col_start"]:part["col_start"] + part["cols"]] = \
                    array[lo - part["row_start"]:hi - part["row_start"]]
        yield start, batch


def read_table(directory: str) -> np.ndarray:
    """The whole exported table as one array (for tables that fit in memory)."""
    manifest = read_manifest(directory)
    table = np.zeros((manifest["rows"], manifest["dim"]), manifest["dtype"])
    for part, array in _parts(directory, manifest):
        table[part["row_start"]:part["row_start"] + part["rows"],
              part["col_start"]:part["col_start"] + part["cols"]] = array
    return table


__all__ = ["export_table", "iter_table", "read_manifest", "read_table"]
