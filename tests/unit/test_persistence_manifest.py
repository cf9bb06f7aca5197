"""A checkpoint's manifest (persistence/manifest.py): a manifest naming a file outside the
checkpoint is refused, naming the manifest, the field and the value."""

import json
import os
import re
import shutil

import pytest

from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    restore_checkpoint,
)
from tests.unit import checkpoint_helpers as ch
from tests.unit.checkpoint_helpers import saved_checkpoint  # noqa: F401  (the `saved` fixture)


@pytest.mark.parametrize("value", ["ABSOLUTE", "../../outside/table", "tables/../../x"])
def test_manifest_naming_a_file_outside_is_refused(saved, tmp_path, value):
    directory, _ = saved
    path = latest_checkpoint(directory)
    outside = tmp_path / "outside"
    outside.mkdir()
    value = str(outside / "table") if value == "ABSOLUTE" else value
    for name in os.listdir(os.path.join(path, "tables", "0", "0")):  # planted copies
        shutil.copy(os.path.join(path, "tables", "0", "0", name), outside / name)
    manifest_path = os.path.join(path, "manifest.json")
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["blocks"][0]["tables"][0]["parts"][0]["file"] = value
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    pattern = f"manifest {re.escape(manifest_path)}.*Received: .*file='{re.escape(value)}'"
    with pytest.raises(ValueError, match=pattern):
        read_full_tables(path)
    with pytest.raises(ValueError, match=pattern):
        restore_checkpoint(ch.build(ch.legacy_adagrad), directory)
