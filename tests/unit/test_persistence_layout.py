"""Where a checkpoint's files lie (persistence/layout.py): paths come from positions, never
from names; `latest` and every shard path must stay inside the checkpoint directory."""

import os
import re
import shutil

import numpy as np
import pytest

from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    restore_checkpoint,
    save_checkpoint,
)
from tests.unit import checkpoint_helpers as ch
from tests.unit.checkpoint_helpers import saved_checkpoint  # noqa: F401  (the `saved` fixture)


def test_table_names_never_become_paths(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    columns = (str(outside), "../../../x", "ok")
    directory = tmp_path / "a" / "b" / "ckpt"
    model = ch.build(columns=columns)
    save_checkpoint(model.emb, str(directory))
    save_checkpoint(model.emb, str(directory), step=1)

    assert os.listdir(outside) == []
    for rel in ch.files_under(tmp_path):
        assert rel.startswith(os.path.join("a", "b", "ckpt", "ckpt-")) or rel == os.path.join(
            "a", "b", "ckpt", "latest"
        ), rel
    full = read_full_tables(latest_checkpoint(str(directory)))
    want = model.emb.get_global_weights()
    assert sorted(full["embeddings"]) == sorted(columns)
    other = ch.build(seed=2, columns=columns)
    restore_checkpoint(other.emb, str(directory))
    for name in columns:
        np.testing.assert_array_equal(full["embeddings"][name]["table"], want[name])
        np.testing.assert_array_equal(other.emb.get_global_weights()[name], want[name])


@pytest.mark.parametrize(
    "pointer",
    ["ABSOLUTE", "../elsewhere/ckpt-000000004", "ckpt-000000004/../../elsewhere/ckpt-000000004"],
)
def test_latest_leading_outside_is_refused(saved, tmp_path, pointer):
    directory, model = saved
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(latest_checkpoint(directory), elsewhere / "ckpt-000000004")
    value = str(elsewhere / "ckpt-000000004") if pointer == "ABSOLUTE" else pointer
    with open(os.path.join(directory, "latest"), "w", encoding="utf-8") as f:
        f.write(value + "\n")
    pointer = re.escape(os.path.join(directory, "latest"))
    pattern = f"{pointer}.*Received: latest='{re.escape(value)}'"
    with pytest.raises(ValueError, match=pattern):
        latest_checkpoint(directory)
    with pytest.raises(ValueError, match=pattern):
        restore_checkpoint(ch.build(ch.legacy_adagrad), directory)


def test_latest_through_a_symlink_leading_outside_is_refused(saved, tmp_path):
    directory, _ = saved
    shutil.move(latest_checkpoint(directory), tmp_path / "moved")
    os.symlink(tmp_path / "moved", os.path.join(directory, "ckpt-000000004"))
    with pytest.raises(ValueError, match="leads outside.*Received: latest='ckpt-000000004'"):
        latest_checkpoint(directory)


def test_a_shard_symlinked_outside_is_refused(saved, tmp_path):
    directory, _ = saved
    path = latest_checkpoint(directory)
    shard = os.path.join(path, "tables", "0", "0", "table-r0.npy")
    shutil.move(shard, tmp_path / "table-r0.npy")
    os.symlink(tmp_path / "table-r0.npy", shard)
    with pytest.raises(
        ValueError, match="shard file would lie outside the directory .*table-r0.npy"
    ):
        read_full_tables(path)
