"""The I/O under every store (persistence/io.py): a write error names the file, the rank
and the cause; a whole directory written beside the old one replaces it in one step, and
until then (a failing or killed writer) the old one stays whole."""

import errno
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from merlin_models_de.persistence import io
from tests.unit.flush_spy import on_disk, record_flushes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_write_error_names_the_file_the_rank_and_the_cause(tmp_path):
    for write in (io.write_array, lambda p, a: io.write_arrays(p, {"w0": a})):
        with pytest.raises(
            OSError,
            match=r"Cannot write /dev/full on rank 0: No space left on device \(ENOSPC\)",
        ) as info:
            write("/dev/full", np.ones((60_000, 2), np.float32))
        assert info.value.errno == errno.ENOSPC
    blocked = tmp_path / "x.npy"  # a file replaced by a directory
    blocked.mkdir()
    with pytest.raises(
        OSError, match=rf"Cannot write {blocked} on rank 0: Is a directory \(EISDIR\)"
    ):
        io.write_array(str(blocked), np.ones(3))


def tree(root):
    """{relative path: content} of every file below ``root``."""
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                out[os.path.relpath(os.path.join(directory, name), root)] = f.read()
    return out


def write_version(version):
    """A ``write`` for :func:`io.write_whole`: a small tree that says ``version``."""

    def write(path):
        os.makedirs(os.path.join(path, "variables"))
        for name in ("graph.pb", "variables/data"):
            with open(os.path.join(path, name), "w", encoding="utf-8") as f:
                f.write(f"{version} {name}")

    return write


@pytest.mark.parametrize("exchange", ["one atomic exchange", "two renames"])
def test_a_whole_directory_replaces_the_old_one(tmp_path, monkeypatch, exchange):
    target = str(tmp_path / "saved")
    io.write_whole(target, write_version("old"))
    os.makedirs(os.path.join(target, "stale-extra"))  # the old version's own file
    if exchange == "two renames":  # a file system without renameat2's exchange
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    io.write_whole(target, write_version("new"))
    assert tree(target) == {"graph.pb": "new graph.pb", "variables/data": "new variables/data"}
    assert os.listdir(tmp_path) == ["saved"]  # no temporary, no old copy left


def test_a_failing_write_leaves_the_old_directory_whole(tmp_path):
    target = str(tmp_path / "saved")
    io.write_whole(target, write_version("old"))

    def fail_halfway(path):
        write_version("new")(path)
        raise RuntimeError("the save failed on another rank")

    with pytest.raises(RuntimeError, match="failed on another rank"):
        io.write_whole(target, fail_halfway)
    assert tree(target) == {"graph.pb": "old graph.pb", "variables/data": "old variables/data"}
    assert os.listdir(tmp_path) == ["saved"]


KILLED_WRITER = """
import os, signal, sys
sys.path.insert(0, os.getcwd())
from merlin_models_de.persistence import io

def write(path):
    os.makedirs(os.path.join(path, "variables"))
    with open(os.path.join(path, "variables", "data"), "w") as f:
        f.write("new variables/data")
    os.kill(os.getpid(), signal.SIGKILL)  # killed before the graph is written

io.write_whole(sys.argv[1], write)
"""


def test_a_writer_killed_mid_write_leaves_the_old_directory_whole(tmp_path):
    target = str(tmp_path / "saved")
    io.write_whole(target, write_version("old"))
    run = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, target], cwd=ROOT, timeout=120, check=False
    )
    assert run.returncode == -signal.SIGKILL
    assert tree(target) == {"graph.pb": "old graph.pb", "variables/data": "old variables/data"}
    left = [n for n in os.listdir(tmp_path) if n != "saved"]
    assert len(left) == 1 and left[0].startswith(".tmp-") and left[0].endswith("-saved")


def test_every_file_is_on_disk_before_the_swap(tmp_path, monkeypatch):
    target = os.path.realpath(tmp_path / "saved")
    io.write_whole(target, write_version("old"))
    events = record_flushes(monkeypatch)
    io.write_whole(target, write_version("new"))
    monkeypatch.undo()
    swap = next(i for i, e in enumerate(events) if e[0] in ("exchange", "rename", "replace"))
    tmp = events[swap][1]
    flushed = on_disk(events, swap)
    assert {
        tmp,
        os.path.join(tmp, "variables"),
        os.path.join(tmp, "graph.pb"),
        os.path.join(tmp, "variables", "data"),
    } <= flushed
