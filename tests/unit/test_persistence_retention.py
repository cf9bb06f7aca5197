"""Which checkpoints stay (persistence/retention.py): a re-saved step replaces the old copy
only after `latest` moved, `keep` holds the newest saves, a crash while removing never
loses the new checkpoint, and the next save removes the leftovers of crashed ones."""

import os
import shutil

import numpy as np
import pytest

from merlin_models_de.persistence.checkpoint import (
    CheckpointCallback,
    latest_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from tests.unit import checkpoint_helpers as ch
from tests.unit.checkpoint_helpers import saved_checkpoint  # noqa: F401  (the `saved` fixture)


def test_resaving_a_step_replaces_it_after_latest_moved(saved):
    directory, model = saved
    ch.fit(model, steps=1, seed=3)
    save_checkpoint(model, directory, step=4)
    assert ch.ckpt_dirs(directory) == ["ckpt-000000004-1"]
    assert latest_checkpoint(directory).endswith("ckpt-000000004-1")
    fresh = ch.build(ch.legacy_adagrad, seed=2)
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
    fresh = ch.build(ch.legacy_adagrad, seed=2)
    restore_checkpoint(fresh, directory)
    for got, want in zip(ch.weights(fresh), ch.weights(model)):
        np.testing.assert_array_equal(got, want)
    save_checkpoint(model, directory, step=5)  # cleans up what the crash left
    assert sorted(os.listdir(directory)) == ["ckpt-000000004-1", "ckpt-000000005", "latest"]


def test_the_next_save_removes_leftovers_of_crashed_saves(saved):
    directory, model = saved
    os.makedirs(os.path.join(directory, ".tmp-crashed", "tables", "0"))
    open(os.path.join(directory, ".tmp-crashed", "tables", "0", "x.npy"), "w").close()
    open(os.path.join(directory, ".writing-crashed"), "w").close()
    os.makedirs(os.path.join(directory, ".trash-crashed"))
    save_checkpoint(model, directory, step=5)
    assert sorted(os.listdir(directory)) == ["ckpt-000000004", "ckpt-000000005", "latest"]


def test_keep_holds_the_newest_saves(tmp_path):
    model = ch.build(ch.legacy_adagrad)
    every, kept = str(tmp_path / "every"), str(tmp_path / "kept")
    for step in (10, 1, 2, 3):  # saved in this order: step 10 is the oldest save
        save_checkpoint(model, every, step=step)
        save_checkpoint(model, kept, step=step, keep=2)
    assert ch.ckpt_dirs(every) == [
        "ckpt-000000001",
        "ckpt-000000002",
        "ckpt-000000003",
        "ckpt-000000010",
    ]
    assert ch.ckpt_dirs(kept) == ["ckpt-000000002", "ckpt-000000003"]
    assert latest_checkpoint(kept).endswith("ckpt-000000003")
    save_checkpoint(model, kept, step=3, keep=1)
    assert ch.ckpt_dirs(kept) == ["ckpt-000000003-1"]
    assert restore_checkpoint(ch.build(ch.legacy_adagrad), kept)["step"] == 3


@pytest.mark.parametrize("keep", [0, -1, 1.5, "2", True])
def test_keep_must_be_a_positive_int(tmp_path, keep):
    with pytest.raises(ValueError, match=f"Received: keep={keep!r}"):
        save_checkpoint(ch.build(), str(tmp_path), keep=keep)
    with pytest.raises(ValueError, match=f"Received: keep={keep!r}"):
        CheckpointCallback(str(tmp_path), keep=keep)
