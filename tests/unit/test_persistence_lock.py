"""One writer per checkpoint directory (persistence/lock.py): two real jobs saving into one
directory never destroy it; the lock file names its holder and appears with it; a live
holder is refused by name; a lock whose holder is gone is taken over with its leftovers."""

import errno
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from merlin_models_de.persistence import lock
from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.persistence.manifest import check_complete
from tests.unit import checkpoint_helpers as ch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_lock(directory, **holder):
    """A lock file holding ``holder`` (as an earlier version wrote it: no PID namespace)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w", encoding="utf-8") as f:
        json.dump(holder, f)


def test_two_concurrent_jobs_never_destroy_the_directory(tmp_path):
    directory, go = str(tmp_path / "ckpt"), str(tmp_path / "go")
    jobs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "tests", "scripts", "concurrent_saver.py"),
                directory,
                go,
                str(tmp_path / f"job{i}.json"),
                str(i + 1),
            ],
            cwd=ROOT,
        )
        for i in range(2)
    ]
    open(go, "w").close()  # each job builds its model, then saves as soon as it sees `go`
    for job in jobs:
        assert job.wait(timeout=300) == 0
    reports = [json.load(open(tmp_path / f"job{i}.json", encoding="utf-8")) for i in range(2)]

    for me, other in ((0, 1), (1, 0)):
        for result in reports[me]["results"]:
            # every save succeeded or was refused naming the other job, nothing else
            assert result == "ok" or (
                result.startswith("CheckpointLockedError")
                and f"pid={reports[other]['pid']}" in result
            ), result
    latest = latest_checkpoint(directory)
    assert latest is not None and os.path.basename(latest) in ch.ckpt_dirs(directory)
    for name in ch.ckpt_dirs(directory):  # every checkpoint left is whole
        read_full_tables(os.path.join(directory, name))
        check_complete(os.path.join(directory, name))
    assert len(ch.ckpt_dirs(directory)) <= 2
    assert sorted(os.listdir(directory)) == sorted(ch.ckpt_dirs(directory) + ["latest"])
    fresh = ch.build(ch.legacy_adagrad, seed=5)
    assert restore_checkpoint(fresh, directory)["step"] == 14


def test_a_lock_is_never_seen_without_its_holder(tmp_path, sleeper):
    # the lock appears with its content (a hard link of the holder's own file): a job that
    # loses the race names the winner, and no file of the making is left behind
    directory = str(tmp_path / "ckpt")
    first, second = lock.DirectoryLock(directory), lock.DirectoryLock(directory)
    # another live process of this host holds it
    first.holder.update(pid=sleeper.pid, pid_start=lock.process_start(sleeper.pid)[1])
    first.acquire()
    assert sorted(os.listdir(directory)) == [".lock"]
    with open(first.path, encoding="utf-8") as f:
        assert json.load(f)["token"] == first.token
    with pytest.raises(lock.CheckpointLockedError, match=rf"pid={sleeper.pid}, "):
        second.acquire()
    first.release()
    assert os.listdir(directory) == []


def test_without_hard_links_a_lock_being_written_is_waited_for(tmp_path, monkeypatch):
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
    writer = threading.Timer(
        0.1,
        write_lock,
        (directory,),
        dict(host="elsewhere", pid=7, job="job-7", started=time.time()),
    )
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
    directory = str(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad)
    save_checkpoint(model, directory, step=1)
    os.makedirs(os.path.join(directory, ".tmp-left-by-the-holder"))
    write_lock(
        directory,
        host=socket.gethostname(),
        pid_ns=os.readlink("/proc/self/ns/pid"),
        pid=sleeper.pid,
        job="job-42",
        started=time.time(),
        token="x",
    )
    with pytest.raises(
        lock.CheckpointLockedError,
        match=rf"being written by another job \(host='{socket.gethostname()}', "
        rf"pid={sleeper.pid}, job='job-42', launch=None, started=.* UTC, pid_namespace=.*\)"
        rf".*process {sleeper.pid} runs on this host",
    ):
        save_checkpoint(model, directory, step=2)
    assert ch.ckpt_dirs(directory) == ["ckpt-000000001"]
    assert os.path.exists(os.path.join(directory, ".tmp-left-by-the-holder"))

    sleeper.kill()
    sleeper.wait()
    with pytest.warns(RuntimeWarning, match=f"stale lock .* process {sleeper.pid} no longer"):
        save_checkpoint(model, directory, step=2)
    # the dead holder's leftovers go; the lock is released after the save
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "ckpt-000000002", "latest"]


def test_a_lock_from_another_host_is_trusted_until_it_is_old(tmp_path):
    directory = str(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad)
    write_lock(directory, host="elsewhere", pid=1, job="4711", started=time.time(), token="y")
    path = re.escape(os.path.join(directory, ".lock"))
    with pytest.raises(
        StorageError,
        match=rf"host='elsewhere', pid=1.*check `ps -p 1` on "
        rf"elsewhere or job 4711 in your scheduler\), "
        rf"delete {path}",
    ):
        save_checkpoint(model, directory, step=1)
    old = time.time() - lock.STALE_AFTER_SECONDS - 60
    os.utime(os.path.join(directory, ".lock"), (old, old))
    with pytest.warns(RuntimeWarning, match=r"stale lock .* h old"):
        save_checkpoint(model, directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_a_lock_of_this_very_launch_is_its_own_interrupted_save(tmp_path, monkeypatch):
    # an elastic job whose rank 0 was lost mid-save: the new rank 0 runs on another host
    launch_of(monkeypatch, job="4711", step="0")
    directory = str(tmp_path / "ckpt")
    write_lock(
        directory,
        host="lost-host",
        pid=1,
        job="4711",
        launch="slurm-step@4711.0",
        started=time.time(),
        token="z",
    )
    with pytest.warns(RuntimeWarning, match=r"host='lost-host'.*this launch left it"):
        save_checkpoint(ch.build(ch.legacy_adagrad), directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def launch_of(monkeypatch, job, step):
    """This process as a rank of SLURM job ``job``, step ``step`` (not under horovodrun)."""
    for key in ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_STEP_ID", step)


HOLDER = """
import os, sys
sys.path.insert(0, os.getcwd())
from merlin_models_de.persistence.lock import DirectoryLock
lock = DirectoryLock(sys.argv[1])
lock.acquire()
os.makedirs(os.path.join(sys.argv[1], ".tmp-its-save"))
print("holding", flush=True)
sys.stdin.read()  # until the test lets go
"""


@pytest.mark.parametrize("step", ["1", "0"])
def test_a_job_step_never_takes_the_lock_of_a_live_step_of_its_allocation(
    tmp_path, monkeypatch, step
):
    # two job steps of one SLURM allocation share SLURM_JOB_ID; the holder runs here, alive
    directory = str(tmp_path / "ckpt")
    env = dict(os.environ, SLURM_JOB_ID="77", SLURM_STEP_ID="0")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, directory],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        launch_of(monkeypatch, job="77", step=step)
        model = ch.build(ch.legacy_adagrad)
        with pytest.raises(
            lock.CheckpointLockedError,
            match=rf"pid={holder.pid}, job='77', launch='slurm-step@77.0'.*"
            rf"process {holder.pid} runs on this host",
        ):
            save_checkpoint(model, directory, step=1)
        assert sorted(os.listdir(directory)) == [".lock", ".tmp-its-save"]  # untouched
    finally:
        holder.kill()
        holder.wait()
    with pytest.warns(RuntimeWarning, match=f"process {holder.pid} no longer runs"):
        save_checkpoint(model, directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_a_reused_pid_is_not_the_holder(tmp_path, sleeper):
    directory = str(tmp_path / "ckpt")
    runs, start = lock.process_start(sleeper.pid)
    assert runs and start is not None
    write_lock(
        directory,
        host=socket.gethostname(),
        pid_ns=os.readlink("/proc/self/ns/pid"),
        pid=sleeper.pid,
        pid_start=start - 1,
        job=None,
        started=time.time(),
        token="r",
    )
    with pytest.warns(
        RuntimeWarning,
        match=rf"process {sleeper.pid} on this host is not its holder .*the pid was reused",
    ):
        save_checkpoint(ch.build(ch.legacy_adagrad), directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_an_empty_lock_a_few_seconds_old_is_stale(tmp_path):
    directory = str(tmp_path / "ckpt")
    os.makedirs(directory)
    open(os.path.join(directory, ".lock"), "w").close()  # its writer died creating it
    old = time.time() - lock.EMPTY_STALE_SECONDS - 1
    os.utime(os.path.join(directory, ".lock"), (old, old))
    with pytest.warns(RuntimeWarning, match=r"content ''.*it has been empty for \d+ s"):
        save_checkpoint(ch.build(ch.legacy_adagrad), directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_a_lock_that_names_no_holder_says_how_to_release_it(tmp_path):
    directory = str(tmp_path / "ckpt")
    os.makedirs(directory)
    path = os.path.join(directory, ".lock")
    with open(path, "w", encoding="utf-8") as f:
        f.write("held by the nightly job")
    model = ch.build(ch.legacy_adagrad)
    with pytest.raises(
        lock.CheckpointLockedError,
        match=rf"lock {re.escape(path)} does not name its holder \(it holds "
        rf"'held by the nightly job'\).*Make sure no job saves there .*"
        rf"then delete {re.escape(path)}",
    ):
        save_checkpoint(model, directory, step=1)
    os.remove(path)  # as the error says
    save_checkpoint(model, directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]
