"""Who writes a checkpoint directory, and what a failed write or read leaves behind.

Two real jobs saving into one directory never destroy it (one writer at a time: a lock file
naming its holder; stale locks taken over); a commit checks every file before `latest`
moves; a full disk is named before and while writing; a read error mid-restore leaves the
model untouched; the callback saves with several steps per call."""
import errno
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.persistence import checkpoint, files
from merlin_models_de.persistence.checkpoint import (CheckpointCallback, CheckpointError,
                                                     latest_checkpoint, read_full_tables,
                                                     restore_checkpoint, save_checkpoint)
from tests.unit import checkpoint_helpers as ch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def legacy_adagrad():
    return tf.keras.optimizers.legacy.Adagrad(0.1)


def ckpt_dirs(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("ckpt-"))


def write_lock(directory, **holder):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w", encoding="utf-8") as f:
        json.dump(holder, f)


# ---- 1. one writer at a time ------------------------------------------------------------------


def test_two_concurrent_jobs_never_destroy_the_directory(tmp_path):
    directory, go = str(tmp_path / "ckpt"), str(tmp_path / "go")
    jobs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "scripts",
                                                           "concurrent_saver.py"),
                              directory, go, str(tmp_path / f"job{i}.json"), str(i + 1)],
                             cwd=ROOT) for i in range(2)]
    open(go, "w").close()  # each job builds its model, then saves as soon as it sees `go`
    for job in jobs:
        assert job.wait(timeout=300) == 0
    reports = [json.load(open(tmp_path / f"job{i}.json", encoding="utf-8")) for i in range(2)]

    for me, other in ((0, 1), (1, 0)):
        for result in reports[me]["results"]:
            # every save succeeded or was refused naming the other job, nothing else
            assert result == "ok" or (
                result.startswith("CheckpointLockedError") and
                f"pid={reports[other]['pid']}" in result), result
    latest = latest_checkpoint(directory)
    assert latest is not None and os.path.basename(latest) in ckpt_dirs(directory)
    for name in ckpt_dirs(directory):  # every checkpoint left is whole
        read_full_tables(os.path.join(directory, name))
        files.check_complete(os.path.join(directory, name))
    assert len(ckpt_dirs(directory)) <= 2
    assert sorted(os.listdir(directory)) == sorted(ckpt_dirs(directory) + ["latest"])
    fresh = ch.build(legacy_adagrad, seed=5)
    assert restore_checkpoint(fresh, directory)["step"] == 14


def test_a_lock_is_never_seen_without_its_holder(tmp_path, sleeper):
    # the lock appears with its content (a hard link of the holder's own file): a job that
    # loses the race names the winner, and no file of the making is left behind
    from merlin_models_de.persistence import lock

    directory = str(tmp_path / "ckpt")
    first, second = lock.DirectoryLock(directory), lock.DirectoryLock(directory)
    first.holder["pid"] = sleeper.pid  # another live process of this host holds it
    first.acquire()
    assert sorted(os.listdir(directory)) == [".lock"]
    with open(first.path, encoding="utf-8") as f:
        assert json.load(f)["token"] == first.token
    with pytest.raises(lock.CheckpointLockedError, match=rf"pid={sleeper.pid}, "):
        second.acquire()
    first.release()
    assert os.listdir(directory) == []


def test_without_hard_links_a_lock_being_written_is_waited_for(tmp_path, monkeypatch):
    import threading

    from merlin_models_de.persistence import lock

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    directory = str(tmp_path / "ckpt")
    mine = lock.DirectoryLock(directory)
    mine.acquire()  # made in two steps
    with open(mine.path, encoding="utf-8") as f:
        assert json.load(f)["token"] == mine.token
    mine.release()
    # another job created the lock and writes its holder a moment later
    open(os.path.join(directory, ".lock"), "w").close()
    writer = threading.Timer(0.1, write_lock, (directory,),
                             dict(host="elsewhere", pid=7, job="job-7", started=time.time()))
    writer.start()
    with pytest.raises(lock.CheckpointLockedError, match=r"host='elsewhere', pid=7, job='job-7'"):
        lock.DirectoryLock(directory).acquire()
    writer.join()
    assert os.listdir(directory) == [".lock"]


@pytest.fixture(name="sleeper")
def _sleeper():
    """A live process of this host, not this one (the holder of a lock)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_holder_is_refused_by_name_and_a_dead_one_taken_over(tmp_path, sleeper):
    from merlin_models_de.persistence import lock

    directory = str(tmp_path / "ckpt")
    model = ch.build(legacy_adagrad)
    save_checkpoint(model, directory, step=1)
    os.makedirs(os.path.join(directory, ".tmp-left-by-the-holder"))
    write_lock(directory, host=socket.gethostname(), pid=sleeper.pid, job="job-42",
               started=time.time(), token="x")
    with pytest.raises(lock.CheckpointLockedError,
                       match=rf"being written by another job \(host='{socket.gethostname()}', "
                             rf"pid={sleeper.pid}, job='job-42', started=.* UTC\)"):
        save_checkpoint(model, directory, step=2)
    assert ckpt_dirs(directory) == ["ckpt-000000001"]
    assert os.path.exists(os.path.join(directory, ".tmp-left-by-the-holder"))

    sleeper.kill()
    sleeper.wait()
    with pytest.warns(RuntimeWarning, match=f"stale lock .* process {sleeper.pid} no longer"):
        save_checkpoint(model, directory, step=2)
    # the dead holder's leftovers go; the lock is released after the save
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "ckpt-000000002", "latest"]


def test_a_lock_from_another_host_is_trusted_until_it_is_old(tmp_path):
    from merlin_models_de.persistence import lock

    directory = str(tmp_path / "ckpt")
    model = ch.build(legacy_adagrad)
    write_lock(directory, host="elsewhere", pid=1, job=None, started=time.time(), token="y")
    with pytest.raises(CheckpointError, match="host='elsewhere', pid=1"):
        save_checkpoint(model, directory, step=1)
    old = time.time() - lock.STALE_AFTER_SECONDS - 60
    os.utime(os.path.join(directory, ".lock"), (old, old))
    with pytest.warns(RuntimeWarning, match=r"stale lock .* h old"):
        save_checkpoint(model, directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_a_lock_of_this_very_job_is_its_own_interrupted_save(tmp_path, monkeypatch):
    # an elastic job whose rank 0 was lost mid-save: the new rank 0 runs on another host
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    directory = str(tmp_path / "ckpt")
    write_lock(directory, host="lost-host", pid=1, job="4711", started=time.time(), token="z")
    with pytest.warns(RuntimeWarning, match=r"host='lost-host'.*this job left it"):
        save_checkpoint(ch.build(legacy_adagrad), directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_a_commit_checks_every_file_before_latest_moves(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    model = ch.build(legacy_adagrad)
    first = save_checkpoint(model, directory, step=1)
    real = checkpoint.write_arrays

    def lose_a_shard(path, arrays):  # what another writer's clean-up did to a save
        os.remove(os.path.join(os.path.dirname(path), "tables", "0", "1", "table-r0.npy"))
        real(path, arrays)

    monkeypatch.setattr(checkpoint, "write_arrays", lose_a_shard)
    with pytest.raises(CheckpointError, match=r"tables/0/1/table-r0.npy is missing"):
        save_checkpoint(model, directory, step=2)
    assert latest_checkpoint(directory) == os.path.realpath(first)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


# ---- 6. full disks ----------------------------------------------------------------------------


@pytest.fixture(name="small_disk")
def _small_disk(tmp_path):
    """A 1 MiB tmpfs (needs root; skipped where it cannot be mounted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield str(mount)
    subprocess.run(["umount", str(mount)], check=True)


def test_a_save_that_does_not_fit_is_refused_before_writing(small_disk):
    model = ch.build(legacy_adagrad, rows=(40_000, 30, 10))  # ~1.3 MB with its accumulator
    directory = os.path.join(small_disk, "ckpt")
    with pytest.raises(OSError, match=rf"Not enough free space in {directory} for the new "
                                      r"checkpoint .*it needs 1\.[0-9] MiB .*has 1\.0 MiB "
                                      r"\(1048576 bytes\) free") as info:
        save_checkpoint(model, directory, step=1)
    assert info.value.errno == errno.ENOSPC
    assert not os.path.exists(directory) or os.listdir(directory) == []


def test_a_write_error_names_the_file_the_rank_and_the_cause(tmp_path):
    for write in (files.write_array, lambda p, a: files.write_arrays(p, {"w0": a})):
        with pytest.raises(OSError, match=r"Cannot write /dev/full on rank 0: No space left "
                                          r"on device \(ENOSPC\)") as info:
            write("/dev/full", np.ones((60_000, 2), np.float32))
        assert info.value.errno == errno.ENOSPC
    blocked = tmp_path / "x.npy"  # a file replaced by a directory
    blocked.mkdir()
    with pytest.raises(OSError, match=rf"Cannot write {blocked} on rank 0: Is a directory "
                                      r"\(EISDIR\)"):
        files.write_array(str(blocked), np.ones(3))


# ---- 3. a failed restore writes nothing -------------------------------------------------------


def test_a_read_error_mid_restore_leaves_the_model_untouched(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    model = ch.build(legacy_adagrad)
    ch.fit(model)
    save_checkpoint(model, directory)  # 3 tables and 3 accumulators: 6 shard files
    other = ch.build(legacy_adagrad, seed=2)
    ch.fit(other, steps=1, seed=4)
    before = ch.weights(other) + [v.numpy() for v in other.optimizer.variables()]
    real, calls = np.load, []

    def fail_fifth_read(path, *args, **kwargs):
        if kwargs.get("mmap_mode"):
            calls.append(path)
            if len(calls) == 5:
                raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", fail_fifth_read)
    with pytest.raises(CheckpointError, match=r"Cannot read checkpoint file .*-r0\.npy on "
                                              r"rank 0: .*Input/output error"):
        restore_checkpoint(other, directory)
    after = ch.weights(other) + [v.numpy() for v in other.optimizer.variables()]
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)


# ---- 4. the callback with several steps per call ----------------------------------------------


@pytest.mark.parametrize("every, per_call, saved", [(6, 4, [8, 12, 20, 24]), (5, 8, [8, 16, 24]),
                                                    (4, 1, [4, 8, 12, 16, 20, 24])])
def test_the_callback_saves_at_the_first_batch_end_past_each_multiple(tmp_path, every, per_call,
                                                                      saved):
    directory = str(tmp_path / "ckpt")
    model = ch.build(legacy_adagrad, steps_per_execution=per_call)
    x, y = ch.data(16 * 24)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[CheckpointCallback(directory, every_n_steps=every, each_epoch=False)])
    assert [files.parse_name(n)[0] for n in ckpt_dirs(directory)] == saved
