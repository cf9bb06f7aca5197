"""Saving (persistence/checkpoint.py): a crash mid-save keeps the checkpoint `latest`
names, a commit checks every file and flushes it to disk before `latest` moves (and before
pruning starts), and a save that does not fit on the disk is refused before anything is
written."""

import errno
import os
import subprocess

import numpy as np
import pytest

from merlin_models_de.persistence import checkpoint
from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from tests.unit import checkpoint_helpers as ch
from tests.unit.checkpoint_helpers import saved_checkpoint  # noqa: F401  (the `saved` fixture)
from tests.unit.flush_spy import on_disk, record_flushes


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

    fresh = ch.build(ch.legacy_adagrad, seed=2)
    assert restore_checkpoint(fresh, directory)["step"] == 4
    for got, want in zip(ch.weights(fresh), before):
        np.testing.assert_array_equal(got, want)
    assert not [n for n in os.listdir(directory) if n.startswith(".tmp-")]


def test_a_commit_checks_every_file_before_latest_moves(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad)
    first = save_checkpoint(model, directory, step=1)
    real = checkpoint.write_arrays

    def lose_a_shard(path, arrays):  # what another writer's clean-up did to a save
        os.remove(os.path.join(os.path.dirname(path), "tables", "0", "1", "table-r0.npy"))
        real(path, arrays)

    monkeypatch.setattr(checkpoint, "write_arrays", lose_a_shard)
    with pytest.raises(StorageError, match=r"tables/0/1/table-r0.npy is missing"):
        save_checkpoint(model, directory, step=2)
    assert latest_checkpoint(directory) == os.path.realpath(first)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


@pytest.fixture(name="small_disk")
def _small_disk(tmp_path):
    """A 1 MiB tmpfs (needs root; skipped where it cannot be mounted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield str(mount)
    subprocess.run(["umount", str(mount)], check=True)


def test_a_save_that_does_not_fit_is_refused_before_writing(small_disk):
    model = ch.build(ch.legacy_adagrad, rows=(40_000, 30, 10))  # ~1.3 MB with its accumulator
    directory = os.path.join(small_disk, "ckpt")
    with pytest.raises(
        OSError,
        match=rf"Not enough free space in {directory} for the new "
        r"checkpoint .*it needs 1\.[0-9] MiB .*has 1\.0 MiB "
        r"\(1048576 bytes\) free",
    ) as info:
        save_checkpoint(model, directory, step=1)
    assert info.value.errno == errno.ENOSPC
    assert not os.path.exists(directory) or os.listdir(directory) == []


def test_every_file_is_on_disk_before_latest_moves_and_pruning_starts(tmp_path, monkeypatch):
    directory = os.path.realpath(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad)
    save_checkpoint(model, directory, step=1)
    events = record_flushes(monkeypatch)
    final = os.path.realpath(save_checkpoint(model, directory, step=2, keep=1))
    monkeypatch.undo()

    tmp = next(e[1] for e in events if e[0] == "rename" and e[2] == final)
    latest = next(
        i
        for i, e in enumerate(events)
        if e[0] == "replace" and e[2] == os.path.join(directory, "latest")
    )
    flushed = {path.replace(tmp, final) for path in on_disk(events, latest)}
    below = [os.path.join(d, n) for d, dirs, files in os.walk(final) for n in dirs + files]
    assert len(below) > 8 and set(below + [final]) <= flushed, sorted(
        set(below + [final]) - flushed
    )
    # the rename that names the checkpoint is flushed before `latest` names it
    renamed = events.index(("rename", tmp, final))
    assert ("fsync", directory) in events[renamed:latest]
    # and only then is the older checkpoint removed
    removed = next(
        i
        for i, e in enumerate(events)
        if e[0] == "rename" and e[1] == os.path.join(directory, "ckpt-000000001")
    )
    assert removed > latest
    assert ch.ckpt_dirs(directory) == ["ckpt-000000002"]
