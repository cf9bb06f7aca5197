"""A table export's manifest is checked by arithmetic on its rectangles, for tables of any
size, and a field of the wrong type is named with the manifest (no TensorFlow needed)."""
import json
import os

import numpy as np
import pytest

from merlin_models_de.persistence.files import StorageError
from merlin_models_de.persistence.table_export import iter_table, read_manifest, read_table


@pytest.fixture(name="export")
def _export(tmp_path):
    """An export of a 1000 x 4 table in two row parts, and its manifest (path, dict)."""
    table = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    parts = []
    for i, (start, rows) in enumerate(((0, 600), (600, 400))):
        np.save(tmp_path / f"part-{i:05d}.npy", table[start:start + rows])
        parts.append({"file": f"part-{i:05d}.npy", "row_start": start, "rows": rows,
                      "col_start": 0, "cols": 4})
    manifest = {"format": "mmde-table/1", "table": "item", "rows": 1000, "dim": 4,
                "dtype": "float32", "parts": parts}
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
    with pytest.raises(StorageError, match=rf"manifest.json is damaged: its parts do not cover "
                                           rf"the table \({rows} x 4\) exactly once"):
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


@pytest.mark.parametrize("field, value", [("rows", "1000"), ("rows", 1000.0), ("dim", True),
                                          ("dtype", 4), ("parts", {}), ("parts.0.cols", 4.0),
                                          ("parts.1.row_start", "600"), ("parts.0.file", 7),
                                          ("format", None)])
def test_a_field_of_the_wrong_type_is_named_with_the_manifest(export, field, value):
    directory, manifest = export
    target, key = manifest, field
    if field.startswith("parts."):
        _, index, key = field.split(".")
        target = manifest["parts"][int(index)]
    target[key] = value
    rewrite(directory, manifest)
    shown = key if target is manifest else f"parts[{field.split('.')[1]}].{key}"
    with pytest.raises(StorageError, match=rf"Table export manifest .*manifest.json is damaged: "
                                           rf"{re_escape(shown)} must be of type .*Received: "
                                           rf"{re_escape(shown)}={re_escape(repr(value))}"):
        read_manifest(directory)


def re_escape(text):
    import re

    return re.escape(text)
