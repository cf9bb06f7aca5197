"""Restoring (persistence/restore.py): every file is checked against the manifest and the
model before anything is written into the model; a damaged file, another optimizer's state or
a read error mid-restore is named and leaves the model as it was; `latest` naming a deleted
checkpoint names the intact one and how to restore it."""

import errno
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from tests.unit import checkpoint_helpers as ch
from tests.unit.checkpoint_helpers import saved_checkpoint  # noqa: F401  (the `saved` fixture)


def _shard(directory):
    """The first saved table shard (found by walking, whatever the layout calls it)."""
    root = latest_checkpoint(directory)
    return os.path.join(
        root, [f for f in ch.files_under(root) if os.path.basename(f).startswith("table-")][0]
    )


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


@pytest.mark.parametrize(
    "damage",
    [
        _extra_column,
        _truncated,
        _trailing_bytes,
        _shard_not_npy,
        _missing_shard,
        _empty_dense,
        _dense_reshaped,
        _pickled_dense,
        _manifest_not_json,
        _manifest_without_blocks,
        _manifest_wrong_type,
        _manifest_shard_outside_table,
        _manifest_object_dtype,
    ],
)
def test_a_damaged_checkpoint_names_the_file_and_leaves_the_model_unchanged(saved, damage):
    directory, _ = saved
    path, why = damage(directory)
    model = ch.build(ch.legacy_adagrad, seed=2)
    ch.fit(model, steps=1, seed=5)
    before = ch.weights(model) + [v.numpy() for v in model.optimizer.variables()]
    path = re.escape(path)
    with pytest.raises(ValueError, match=f"{path}.*{why}|{why}.*{path}") as error:
        restore_checkpoint(model, directory)
    assert isinstance(error.value, StorageError)
    after = ch.weights(model) + [v.numpy() for v in model.optimizer.variables()]
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)


def test_a_checkpoint_of_another_optimizer_is_refused(saved):
    directory, _ = saved
    model = ch.build(lambda: tf.keras.optimizers.legacy.Adam(0.1))
    with pytest.raises(
        ValueError,
        match=r"holds \['accumulator', 'table'\] for table '\w', the "
        r"model \(optimizer Adam\) needs \['m', 'table', 'v'\]",
    ):
        restore_checkpoint(model, directory)


def test_a_checkpoint_without_optimizer_state_restores_into_a_compiled_model(tmp_path):
    model = ch.build()
    save_checkpoint(model, str(tmp_path), step=7)
    compiled = ch.build(ch.legacy_adagrad, seed=2)
    assert restore_checkpoint(compiled, str(tmp_path))["step"] == 7
    assert int(compiled.optimizer.iterations.numpy()) == 7
    for got, want in zip(ch.weights(compiled), ch.weights(model)):
        np.testing.assert_array_equal(got, want)
    ch.fit(compiled, steps=1)  # trains on from fresh optimizer state


def test_a_read_error_mid_restore_leaves_the_model_untouched(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad)
    ch.fit(model)
    save_checkpoint(model, directory)  # 3 tables and 3 accumulators: 6 shard files
    other = ch.build(ch.legacy_adagrad, seed=2)
    ch.fit(other, steps=1, seed=4)
    before = ch.weights(other) + [v.numpy() for v in other.optimizer.variables()]
    real, calls = np.memmap, []

    def fail_fifth_read(file, *args, **kwargs):  # the fifth shard file mapped
        calls.append(file.name)
        if len(calls) == 5:
            raise OSError(errno.EIO, "Input/output error", file.name)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(np, "memmap", fail_fifth_read)
    with pytest.raises(
        StorageError,
        match=r"Cannot read checkpoint file .*-r0\.npy on rank 0: .*Input/output error",
    ):
        restore_checkpoint(other, directory)
    after = ch.weights(other) + [v.numpy() for v in other.optimizer.variables()]
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)


def test_latest_naming_a_deleted_checkpoint_names_the_intact_one_and_how(tmp_path):
    directory = str(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad)
    save_checkpoint(model, directory, step=1)
    ch.fit(model, steps=1)
    gone = save_checkpoint(model, directory, step=2)
    shutil.rmtree(gone)  # by hand, or a cleanup job
    pointer = os.path.join(directory, "latest")
    intact = os.path.join(directory, "ckpt-000000001")
    fresh = ch.build(ch.legacy_adagrad, seed=2)
    expected = (
        rf"pointer {re.escape(pointer)} names ckpt-000000002, but the directory "
        rf"{re.escape(os.path.realpath(gone))} is missing .*newest intact checkpoint "
        rf"is {re.escape(intact)} \(step 1\): to restore it, point latest at it "
        rf"\(`echo ckpt-000000001 > {re.escape(pointer)}`\)"
    )
    with pytest.raises(StorageError, match=expected):
        latest_checkpoint(directory)
    with pytest.raises(StorageError, match=expected):
        restore_checkpoint(fresh, directory)

    with open(pointer, "w", encoding="utf-8") as f:  # as the error says
        f.write("ckpt-000000001\n")
    assert restore_checkpoint(fresh, directory)["step"] == 1

    shutil.rmtree(intact)
    with pytest.raises(
        StorageError,
        match=rf"No intact checkpoint is left in "
        rf"{re.escape(directory)}: remove "
        rf"{re.escape(pointer)} to start from scratch",
    ):
        latest_checkpoint(directory)
