"""One table exported to files (persistence/table_export.py), in one process: the manifest
is checked by arithmetic on its rectangles, for tables of any size, and a field of the wrong
type is named with the manifest; a new export replaces the old one whole, so a reader
streaming the old one sees it whole, and one that opened it too late fails naming the part."""

import errno
import json
import os
import re

import numpy as np
import pytest

from merlin_models_de.persistence import table_export
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.persistence.table_export import (
    export_table,
    iter_table,
    read_manifest,
    read_table,
)
from tests.unit.flush_spy import on_disk, record_flushes


@pytest.fixture(name="export")
def _export(tmp_path):
    """An export of a 1000 x 4 table in two row parts, and its manifest (path, dict)."""
    table = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    parts = []
    for i, (start, rows) in enumerate(((0, 600), (600, 400))):
        np.save(tmp_path / f"part-{i:05d}.npy", table[start : start + rows])
        parts.append(
            {
                "file": f"part-{i:05d}.npy",
                "row_start": start,
                "rows": rows,
                "col_start": 0,
                "cols": 4,
            }
        )
    manifest = {
        "format": "mmde-table/1",
        "table": "item",
        "rows": 1000,
        "dim": 4,
        "dtype": "float32",
        "parts": parts,
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    np.testing.assert_array_equal(read_table(str(tmp_path)), table)
    return str(tmp_path), manifest


def rewrite(directory, manifest):
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("rows", [6_300_000, 10**12])
def test_a_manifest_with_rows_no_part_holds_is_refused_at_any_size(export, rows):
    directory, manifest = export
    manifest["rows"] = rows
    manifest["parts"][1]["rows"] = 400  # the parts still end at row 1000
    rewrite(directory, manifest)
    with pytest.raises(
        StorageError,
        match=rf"manifest.json is damaged: its parts do not cover "
        rf"the table \({rows} x 4\) exactly once",
    ):
        read_manifest(directory)
    with pytest.raises(StorageError, match="do not cover"):
        next(iter_table(directory, batch_rows=4096))


def test_overlapping_parts_are_refused(export):
    directory, manifest = export
    manifest["parts"][1].update(row_start=500, rows=500)  # rows 500-599 twice, 1000 missing
    manifest["rows"] = 1000
    rewrite(directory, manifest)
    with pytest.raises(StorageError, match="do not cover the table"):
        read_manifest(directory)


@pytest.mark.parametrize(
    "field, value",
    [
        ("rows", "1000"),
        ("rows", 1000.0),
        ("dim", True),
        ("dtype", 4),
        ("parts", {}),
        ("parts.0.cols", 4.0),
        ("parts.1.row_start", "600"),
        ("parts.0.file", 7),
        ("format", None),
    ],
)
def test_a_field_of_the_wrong_type_is_named_with_the_manifest(export, field, value):
    directory, manifest = export
    target, key = manifest, field
    if field.startswith("parts."):
        _, index, key = field.split(".")
        target = manifest["parts"][int(index)]
    target[key] = value
    rewrite(directory, manifest)
    shown = key if target is manifest else f"parts[{field.split('.')[1]}].{key}"
    with pytest.raises(
        StorageError,
        match=rf"Table export manifest .*manifest.json is damaged: "
        rf"{re_escape(shown)} must be of type .*Received: "
        rf"{re_escape(shown)}={re_escape(repr(value))}",
    ):
        read_manifest(directory)


def re_escape(text):
    import re

    return re.escape(text)


# ---- a new export replaces the old one whole ----------------------------------------------------


@pytest.fixture(name="block")
def _block():
    """A one-process block with one 1000 x 4 table, ``item``."""
    from merlin.schema import Schema

    from merlin_models_de import DistributedEmbeddings
    from tests.schemas import cat

    block = DistributedEmbeddings(Schema([cat("item", 999)]), dim=4)
    block.ensure_built()
    return block


def filled(block, value):
    table = np.full((1000, 4), value, np.float32)
    table[:, 0] = np.arange(1000)
    block.set_global_weights({"item": table})
    return table


def test_a_reader_streaming_an_export_sees_it_whole_while_a_new_one_replaces_it(block, tmp_path):
    directory = str(tmp_path / "items")
    old = filled(block, 1.0)
    export_table(block, "item", directory)
    batches = iter_table(directory, batch_rows=128)
    got = [next(batches)]  # the reader has opened the export and streams it
    new = filled(block, 2.0)
    export_table(block, "item", directory)  # parts were rewritten in place here once
    got += list(batches)
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), old)
    np.testing.assert_array_equal(read_table(directory), new)
    assert sorted(os.listdir(directory)) == ["manifest.json", "part-00000.npy"]
    assert os.listdir(tmp_path) == ["items"]  # no temporary, no old copy left


def test_a_reader_that_opened_the_old_export_fails_naming_the_part_gone(
    block, tmp_path, monkeypatch
):
    directory = str(tmp_path / "items")
    filled(block, 1.0)
    export_table(block, "item", directory)
    real = table_export._read_manifest

    def replaced_meanwhile(path, fd):  # another job exports right after the manifest is read
        manifest = real(path, fd)
        filled(block, 2.0)
        export_table(block, "item", directory)
        return manifest

    monkeypatch.setattr(table_export, "_read_manifest", replaced_meanwhile)
    part = re.escape(os.path.join(directory, "part-00000.npy"))
    with pytest.raises(
        StorageError,
        match=rf"Table export {re.escape(directory)} was replaced "
        rf"while it was being read: its part {part} is gone",
    ):
        read_table(directory)
    monkeypatch.undo()
    assert read_table(directory)[0, 1] == 2.0


def test_a_failed_export_leaves_the_old_one(block, tmp_path, monkeypatch):
    directory = str(tmp_path / "items")
    old = filled(block, 1.0)
    export_table(block, "item", directory)
    filled(block, 2.0)

    def full_disk(path, array):
        raise OSError(errno.ENOSPC, f"Cannot write {path} on rank 0: No space left on device")

    monkeypatch.setattr(table_export, "write_array", full_disk)
    with pytest.raises(
        OSError, match=r"Exporting table 'item' to .* failed on rank 0: .*No space left"
    ):
        export_table(block, "item", directory)
    np.testing.assert_array_equal(read_table(directory), old)
    assert os.listdir(tmp_path) == ["items"]


def test_an_export_never_deletes_what_is_not_its_own(block, tmp_path):
    directory = tmp_path / "items"
    directory.mkdir()
    (directory / "notes.txt").write_text("mine")
    with pytest.raises(
        StorageError, match=r"holds files that are not part of a table export \(notes.txt\)"
    ):
        export_table(block, "item", str(directory))
    assert os.listdir(directory) == ["notes.txt"]


def test_every_part_is_on_disk_before_the_export_is_switched(block, tmp_path, monkeypatch):
    directory = os.path.realpath(tmp_path / "items")
    filled(block, 1.0)
    export_table(block, "item", directory)
    events = record_flushes(monkeypatch)
    export_table(block, "item", directory)
    monkeypatch.undo()
    swap = next(i for i, e in enumerate(events) if e[0] == "exchange")
    tmp = events[swap][1]
    flushed = on_disk(events, swap)
    assert {tmp, os.path.join(tmp, "part-00000.npy"), os.path.join(tmp, "manifest.json")} <= flushed
