"""A checkpoint lock's holder that a pid cannot prove gone (persistence/lock.py): a live
holder in another PID namespace on this host name (a container sharing it), a lock of an
earlier version that does not record its namespace, another machine of the same name; and
a holder whose lock was taken over all the same says so, naming the lock and the taker."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from merlin_models_de.persistence import lock
from merlin_models_de.persistence.checkpoint import latest_checkpoint, save_checkpoint
from tests.unit import checkpoint_helpers as ch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OTHER_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]

# A real save that stops after its shards are written (holding the lock, its files in a
# .tmp-* directory) until the test lets it go on, then prints how it ended.
PAUSED_SAVE = """
import os, sys
sys.path.insert(0, os.getcwd())
from merlin_models_de.persistence import checkpoint
from tests.unit import checkpoint_helpers as ch
model = ch.build(ch.legacy_adagrad)
write = checkpoint._write_shards
def paused(*args):
    write(*args)
    print("written", flush=True)
    sys.stdin.readline()
checkpoint._write_shards = paused
try:
    checkpoint.save_checkpoint(model, sys.argv[1], step=7)
    print("saved", flush=True)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
"""


def _age(path, seconds):
    then = time.time() - seconds
    os.utime(path, (then, then))


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _other_namespace_works():
    try:
        probe = subprocess.run(
            [*OTHER_NAMESPACE, "readlink", "/proc/self/ns/pid"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() != os.readlink("/proc/self/ns/pid")


@pytest.mark.skipif(not _other_namespace_works(), reason="needs root and unshare --pid")
def test_a_holder_in_another_pid_namespace_is_alive_and_told_when_its_lock_is_taken(tmp_path):
    directory = str(tmp_path / "ckpt")
    path = os.path.join(directory, ".lock")
    with open(tmp_path / "holder.log", "w") as log:
        holder = subprocess.Popen(
            [*OTHER_NAMESPACE, sys.executable, "-c", PAUSED_SAVE, directory],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert holder.stdout.readline().strip() == "written"
        held = _read(path)
        # process 1 of its namespace, on this host name: here pid 1 is another process
        assert held["pid"] == 1 and held["host"] == socket.gethostname()
        namespace = str(held.get("pid_ns"))  # the holder's; recorded by the lock
        assert namespace != os.readlink("/proc/self/ns/pid")
        its_save = [n for n in os.listdir(directory) if n.startswith(".tmp-")]
        assert len(its_save) == 1

        model = ch.build(ch.legacy_adagrad)
        with pytest.raises(
            lock.CheckpointLockedError,
            match=rf"pid=1, .*Its process 1 runs in another PID namespace of host "
            rf"'{re.escape(socket.gethostname())}' \({re.escape(namespace)};.*"
            rf"delete {re.escape(path)}",
        ):
            save_checkpoint(model, directory, step=1)
        assert sorted(os.listdir(directory)) == [".lock", *its_save]  # untouched

        # past the staleness rule (a save longer than STALE_AFTER_SECONDS) it is taken over,
        # and the taker's save removes the holder's files
        _age(path, lock.STALE_AFTER_SECONDS + 60)
        with pytest.warns(RuntimeWarning, match=r"stale lock .*pid=1, .* h old"):
            save_checkpoint(model, directory, step=1)
        assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]

        holder.stdin.write("go on\n")
        holder.stdin.flush()
        ended = holder.stdout.read()
        assert holder.wait(timeout=60) == 0
    finally:
        holder.kill()
        holder.wait()
    # the holder says what happened, not that a file of its save is missing
    assert re.match(
        rf"CheckpointLockedError: This save lost the lock {re.escape(path)} of "
        rf"{re.escape(directory)} while it wrote: it is gone",
        ended,
    ), ended
    assert "missing" not in ended
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]
    assert os.path.basename(latest_checkpoint(directory)) == "ckpt-000000001"


def test_a_writer_whose_lock_was_taken_names_the_taker(tmp_path):
    directory = str(tmp_path / "ckpt")
    holder = lock.DirectoryLock(directory)
    holder.acquire()
    holder.check_held()  # held: nothing to say
    taker = lock.DirectoryLock(directory)
    taker.holder["job"] = "taker-job"
    with pytest.warns(RuntimeWarning, match="this process left it"):
        taker.acquire()
    path = re.escape(holder.path)
    with pytest.raises(
        lock.CheckpointLockedError,
        match=rf"lost the lock {path} of .*it now names another job \(.*job='taker-job'",
    ):
        holder.check_held()
    holder.release()  # never removes the taker's lock
    assert _read(holder.path)["token"] == taker.token
    taker.release()
    assert "it is gone" in holder.lost()


def test_a_lock_of_an_earlier_version_is_not_judged_by_its_pid(tmp_path):
    # it does not record its PID namespace: its pid may be another container's process
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], stdout=-1)
    pid = int(gone.stdout)
    directory = str(tmp_path / "ckpt")
    os.makedirs(directory)
    path = os.path.join(directory, ".lock")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"host": socket.gethostname(), "pid": pid, "started": time.time()}, f)
    model = ch.build(ch.legacy_adagrad)
    with pytest.raises(
        lock.CheckpointLockedError,
        match=rf"pid={pid}, .*an unknown PID namespace .*earlier version.*"
        rf"check `ps -p {pid}` in that container\), delete {re.escape(path)}",
    ):
        save_checkpoint(model, directory, step=1)
    _age(path, lock.STALE_AFTER_SECONDS + 60)
    with pytest.warns(RuntimeWarning, match=r"stale lock .* h old"):
        save_checkpoint(model, directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]


def test_another_boot_id_is_a_restart_only_for_a_lock_older_than_this_boot(tmp_path):
    # a younger lock under this host name with another boot id: another machine of that name
    directory = str(tmp_path / "ckpt")
    os.makedirs(directory)
    path = os.path.join(directory, ".lock")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "host": socket.gethostname(),
                "boot": "another-boot",
                "pid_ns": os.readlink("/proc/self/ns/pid"),
                "pid": 1,
                "started": time.time(),
            },
            f,
        )
    model = ch.build(ch.legacy_adagrad)
    with pytest.raises(lock.CheckpointLockedError, match=r"machine named .*another-boot"):
        save_checkpoint(model, directory, step=1)
    with open("/proc/stat", encoding="ascii") as f:
        booted = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    os.utime(path, (booted - 60, booted - 60))  # written before this host booted
    with pytest.warns(RuntimeWarning, match="this host restarted since"):
        save_checkpoint(model, directory, step=1)
    assert sorted(os.listdir(directory)) == ["ckpt-000000001", "latest"]
