"""Checkpoint files in one process: no name leads a file outside the checkpoint; re-saving a
step, crashes mid-save and retention never lose the checkpoint `latest` names; every file is
checked before anything is written into the model."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.persistence import checkpoint
from merlin_models_de.persistence.checkpoint import (CheckpointCallback, latest_checkpoint,
                                         read_full_tables, restore_checkpoint, save_checkpoint)
from tests.unit import checkpoint_helpers as ch


def legacy_adagrad():
    return tf.keras.optimizers.legacy.Adagrad(0.1)


def ckpt_dirs(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("ckpt-"))


# ---- 1. paths come from positions, never from names ------------------------------------------


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
        assert rel.startswith(os.path.join("a", "b", "ckpt", "ckpt-")) or \
            rel == os.path.join("a", "b", "ckpt", "latest"), rel
    full = read_full_tables(latest_checkpoint(str(directory)))
    want = model.emb.get_global_weights()
    assert sorted(full["embeddings"]) == sorted(columns)
    other = ch.build(seed=2, columns=columns)
    restore_checkpoint(other.emb, str(directory))
    for name in columns:
        np.testing.assert_array_equal(full["embeddings"][name]["table"], want[name])
        np.testing.assert_array_equal(other.emb.get_global_weights()[name], want[name])


@pytest.fixture(name="saved")
def _saved(tmp_path):
    """(checkpoint directory, a trained compiled model saved there at step 4)."""
    model = ch.build(legacy_adagrad)
    ch.fit(model)
    directory = str(tmp_path / "ckpt")
    save_checkpoint(model, directory)
    return directory, model


@pytest.mark.parametrize("pointer", ["ABSOLUTE", "../elsewhere/ckpt-000000004",
                                     "ckpt-000000004/../../elsewhere/ckpt-000000004"])
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
        restore_checkpoint(ch.build(legacy_adagrad), directory)


def test_latest_through_a_symlink_leading_outside_is_refused(saved, tmp_path):
    directory, _ = saved
    shutil.move(latest_checkpoint(directory), tmp_path / "moved")
    os.symlink(tmp_path / "moved", os.path.join(directory, "ckpt-000000004"))
    with pytest.raises(ValueError, match="leads outside.*Received: latest='ckpt-000000004'"):
        latest_checkpoint(directory)


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
        restore_checkpoint(ch.build(legacy_adagrad), directory)


def test_a_shard_symlinked_outside_is_refused(saved, tmp_path):
    directory, _ = saved
    path = latest_checkpoint(directory)
    shard = os.path.join(path, "tables", "0", "0", "table-r0.npy")
    shutil.move(shard, tmp_path / "table-r0.npy")
    os.symlink(tmp_path / "table-r0.npy", shard)
    with pytest.raises(ValueError, match="outside the checkpoint directory.*table-r0.npy"):
        read_full_tables(path)


# ---- 2. the checkpoint `latest` names is never lost ---------------------------------------------


def crash_when_moving(monkeypatch, prefix):
    """Makes renames of directories called ``prefix*`` fail, as a crash at that point would."""
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def fake(src, dst, *args, _real=real, **kwargs):
            if os.path.basename(str(src)).startswith(prefix):
                raise OSError(f"injected crash moving {src}")
            return _real(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, name, fake)


def test_a_crash_while_resaving_a_step_keeps_latest_restorable(saved, monkeypatch):
    directory, model = saved
    before = ch.weights(model)
    ch.fit(model, steps=1, seed=3)
    crash_when_moving(monkeypatch, ".tmp-")
    with pytest.raises(OSError, match="injected crash"):
        save_checkpoint(model, directory, step=4)
    monkeypatch.undo()

    fresh = ch.build(legacy_adagrad, seed=2)
    assert restore_checkpoint(fresh, directory)["step"] == 4
    for got, want in zip(ch.weights(fresh), before):
        np.testing.assert_array_equal(got, want)
    assert not [n for n in os.listdir(directory) if n.startswith(".tmp-")]


def test_resaving_a_step_replaces_it_after_latest_moved(saved):
    directory, model = saved
    ch.fit(model, steps=1, seed=3)
    save_checkpoint(model, directory, step=4)
    assert ckpt_dirs(directory) == ["ckpt-000000004-1"]
    assert latest_checkpoint(directory).endswith("ckpt-000000004-1")
    fresh = ch.build(legacy_adagrad, seed=2)
    restore_checkpoint(fresh, directory)
    for got, want in zip(ch.weights(fresh), ch.weights(model)):
        np.testing.assert_array_equal(got, want)


def test_a_crash_while_removing_the_old_copy_keeps_the_new_one(saved, monkeypatch):
    directory, model = saved
    ch.fit(model, steps=1, seed=3)

    def crash(path, *args, **kwargs):
        raise OSError(f"injected crash removing {path}")

    monkeypatch.setattr(shutil, "rmtree", crash)
    with pytest.warns(RuntimeWarning, match="injected crash"):
        new = save_checkpoint(model, directory, step=4)
    monkeypatch.undo()
    assert latest_checkpoint(directory) == os.path.realpath(new)
    fresh = ch.build(legacy_adagrad, seed=2)
    restore_checkpoint(fresh, directory)
    for got, want in zip(ch.weights(fresh), ch.weights(model)):
        np.testing.assert_array_equal(got, want)
    save_checkpoint(model, directory, step=5)  # cleans up what the crash left
    assert sorted(os.listdir(directory)) == ["ckpt-000000004-1", "ckpt-000000005", "latest"]


def test_the_next_save_removes_leftovers_of_crashed_saves(saved):
    directory, model = saved
    os.makedirs(os.path.join(directory, ".tmp-crashed", "tables", "0"))
    open(os.path.join(directory, ".tmp-crashed", "tables", "0", "x.npy"), "w").close()
    open(os.path.join(directory, ".latest-crashed"), "w").close()
    os.makedirs(os.path.join(directory, ".trash-crashed"))
    save_checkpoint(model, directory, step=5)
    assert sorted(os.listdir(directory)) == ["ckpt-000000004", "ckpt-000000005", "latest"]


def test_keep_holds_the_newest_saves(tmp_path):
    model = ch.build(legacy_adagrad)
    every, kept = str(tmp_path / "every"), str(tmp_path / "kept")
    for step in (10, 1, 2, 3):  # saved in this order: step 10 is the oldest save
        save_checkpoint(model, every, step=step)
        save_checkpoint(model, kept, step=step, keep=2)
    assert ckpt_dirs(every) == ["ckpt-000000001", "ckpt-000000002", "ckpt-000000003",
                                "ckpt-000000010"]
    assert ckpt_dirs(kept) == ["ckpt-000000002", "ckpt-000000003"]
    assert latest_checkpoint(kept).endswith("ckpt-000000003")
    save_checkpoint(model, kept, step=3, keep=1)
    assert ckpt_dirs(kept) == ["ckpt-000000003-1"]
    assert restore_checkpoint(ch.build(legacy_adagrad), kept)["step"] == 3


@pytest.mark.parametrize("keep", [0, -1, 1.5, "2", True])
def test_keep_must_be_a_positive_int(tmp_path, keep):
    with pytest.raises(ValueError, match=f"Received: keep={keep!r}"):
        save_checkpoint(ch.build(), str(tmp_path), keep=keep)
    with pytest.raises(ValueError, match=f"Received: keep={keep!r}"):
        CheckpointCallback(str(tmp_path), keep=keep)


class _FakeModel:
    def __init__(self):
        self.optimizer = type("Opt", (), {"iterations": tf.Variable(0, dtype=tf.int64)})()


def test_the_callback_saves_each_step_once(monkeypatch, tmp_path):
    saves = []
    monkeypatch.setattr(checkpoint, "save_checkpoint",
                        lambda model, directory, step=None, keep=None: saves.append((step, keep)))
    callback = CheckpointCallback(str(tmp_path), every_n_steps=2, keep=3)
    model = _FakeModel()
    callback.set_model(model)
    for epoch in range(2):
        for batch in range(4):  # every_n_steps divides the steps per epoch
            model.optimizer.iterations.assign_add(1)
            callback.on_train_batch_end(batch)
        callback.on_epoch_end(epoch)
    assert saves == [(2, 3), (4, 3), (6, 3), (8, 3)]


# ---- 4. every file is checked before anything is written -------------------------------------


def _shard(directory):
    """The first saved table shard (found by walking, whatever the layout calls it)."""
    root = latest_checkpoint(directory)
    return os.path.join(root, [f for f in ch.files_under(root)
                               if os.path.basename(f).startswith("table-")][0])


def _extra_column(directory):
    path = _shard(directory)
    data = np.load(path)
    np.save(path, np.concatenate([data, data[:, :1]], axis=1))
    rows = data.shape[0]
    return path, rf"expected float32 \({rows}, 4\). Received: dtype=float32, shape=\({rows}, 5\)"


def _truncated(directory):
    path = _shard(directory)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    return path, "truncated"


def _trailing_bytes(directory):
    path = _shard(directory)
    with open(path, "ab") as f:
        f.write(b"\0" * 16)
    return path, "trailing bytes"


def _shard_not_npy(directory):
    path = _shard(directory)
    with open(path, "wb") as f:
        f.write(b"not an array")
    return path, "not a readable .npy array"


def _missing_shard(directory):
    path = _shard(directory)
    os.remove(path)
    return path, "is missing"


def _empty_dense(directory):
    path = os.path.join(latest_checkpoint(directory), "dense.npz")
    open(path, "w").close()
    return path, "not a readable .npz archive"


def _dense_reshaped(directory):
    path = os.path.join(latest_checkpoint(directory), "dense.npz")
    arrays = dict(np.load(path))
    arrays["w0"] = arrays["w0"].reshape(-1)
    np.savez(path, **arrays)
    return path, "array 'w0' does not hold what the manifest says"


def _pickled_dense(directory):
    path = os.path.join(latest_checkpoint(directory), "dense.npz")
    arrays = dict(np.load(path))
    arrays["w0"] = np.array([object()], dtype=object)
    np.savez(path, **arrays)
    return path, "not a readable .npz archive.*allow_pickle"


def _manifest_not_json(directory):
    path = os.path.join(latest_checkpoint(directory), "manifest.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{not json")
    return path, "not readable JSON"


def _edit_manifest(directory, edit):
    path = os.path.join(latest_checkpoint(directory), "manifest.json")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    edit(manifest)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    return path


def _manifest_without_blocks(directory):
    return _edit_manifest(directory, lambda m: m.pop("blocks")), "blocks is missing"


def _manifest_wrong_type(directory):
    def edit(m):
        m["blocks"][0]["plan"]["shards"][0]["rows"] = "many"
    return _edit_manifest(directory, edit), r"blocks\[0\].plan is not a sharding plan"


def _manifest_shard_outside_table(directory):
    def edit(m):
        m["blocks"][0]["plan"]["shards"][0]["rows"] += 1
    return _edit_manifest(directory, edit), "lies outside its table"


def _manifest_object_dtype(directory):
    def edit(m):
        m["blocks"][0]["tables"][0]["parts"][0]["dtype"] = "object"
    return _edit_manifest(directory, edit), "must be a numeric dtype"


@pytest.mark.parametrize("damage", [
    _extra_column, _truncated, _trailing_bytes, _shard_not_npy, _missing_shard, _empty_dense,
    _dense_reshaped, _pickled_dense, _manifest_not_json, _manifest_without_blocks,
    _manifest_wrong_type, _manifest_shard_outside_table, _manifest_object_dtype])
def test_a_damaged_checkpoint_names_the_file_and_leaves_the_model_unchanged(saved, damage):
    directory, _ = saved
    path, why = damage(directory)
    model = ch.build(legacy_adagrad, seed=2)
    ch.fit(model, steps=1, seed=5)
    before = ch.weights(model) + [v.numpy() for v in model.optimizer.variables()]
    path = re.escape(path)
    with pytest.raises(ValueError, match=f"{path}.*{why}|{why}.*{path}") as error:
        restore_checkpoint(model, directory)
    assert isinstance(error.value, checkpoint.CheckpointError)
    after = ch.weights(model) + [v.numpy() for v in model.optimizer.variables()]
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)


def test_a_checkpoint_of_another_optimizer_is_refused(saved):
    directory, _ = saved
    model = ch.build(lambda: tf.keras.optimizers.legacy.Adam(0.1))
    with pytest.raises(ValueError, match=r"holds \['accumulator', 'table'\] for table '\w', the "
                                         r"model \(optimizer Adam\) needs \['m', 'table', 'v'\]"):
        restore_checkpoint(model, directory)


def test_a_checkpoint_without_optimizer_state_restores_into_a_compiled_model(tmp_path):
    model = ch.build()
    save_checkpoint(model, str(tmp_path), step=7)
    compiled = ch.build(legacy_adagrad, seed=2)
    assert restore_checkpoint(compiled, str(tmp_path))["step"] == 7
    assert int(compiled.optimizer.iterations.numpy()) == 7
    for got, want in zip(ch.weights(compiled), ch.weights(model)):
        np.testing.assert_array_equal(got, want)
    ch.fit(compiled, steps=1)  # trains on from fresh optimizer state
