"""An elastic reset's memory check counts what the cgroup can still give, not only the host
(merlin_models_de.backends.memory): cgroup v2 and v1 file trees as the kernel writes them,
the limit of a cgroup above the process, and a real cgroup of this machine."""

import os
import subprocess
import sys

import pytest

from merlin_models_de.backends.memory import (
    available_bytes,
    available_memory_bytes,
    cgroup_headroom_bytes,
)
from merlin_models_de.elastic.memory import reset_peak_bytes, reset_problem
from tests.unit.test_elastic_memory import _manifest

GIB, MIB = 2**30, 2**20
V1_NO_LIMIT = "9223372036854771712"


def _files(root, files: dict):
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="ascii") as f:
            f.write(text)


def _membership(tmp_path, text):
    path = tmp_path / "cgroup"
    path.write_text(text)
    return str(path)


def _v2_job(tmp_path, step_max="max"):
    """A unified tree: the job's cgroup limited to 1 GiB (100 MiB used, 40 MiB of it
    droppable cache), the process in a step below it (``step_max``)."""
    root = str(tmp_path / "fs")
    _files(
        root,
        {
            "cgroup.controllers": "cpuset cpu io memory pids\n",
            "job/memory.max": f"{GIB}\n",
            "job/memory.current": f"{100 * MIB}\n",
            "job/memory.stat": f"anon {60 * MIB}\nfile {40 * MIB}\ninactive_file {40 * MIB}\n",
            "job/step/memory.max": f"{step_max}\n",
            "job/step/memory.current": f"{80 * MIB}\n",
            "job/step/memory.stat": f"anon {60 * MIB}\ninactive_file {20 * MIB}\n",
        },
    )
    return root, _membership(tmp_path, "0::/job/step\n")


def test_a_cgroup_v2_limit_above_the_process_bounds_what_it_can_get(tmp_path):
    root, membership = _v2_job(tmp_path)
    assert cgroup_headroom_bytes(root, membership) == GIB - 60 * MIB
    # the step's own, lower limit counts
    root, membership = _v2_job(tmp_path, step_max=str(512 * MIB))
    assert cgroup_headroom_bytes(root, membership) == 512 * MIB - 60 * MIB


def test_no_limit_or_no_memory_controller_leaves_the_host_as_it_is(tmp_path):
    root = str(tmp_path / "fs")
    _files(root, {"cgroup.controllers": "cpu io\n", "memory.max": f"{GIB}\n"})
    assert cgroup_headroom_bytes(root, _membership(tmp_path, "0::/\n")) is None
    _files(root, {"cgroup.controllers": "memory\n", "memory.max": "max\n"})
    assert cgroup_headroom_bytes(root, _membership(tmp_path, "0::/\n")) is None
    host = available_memory_bytes()  # it moves a little between two readings
    assert abs(available_bytes(root, _membership(tmp_path, "0::/\n")) - host) < 64 * MIB


def test_a_cgroup_v1_memory_hierarchy_beside_a_unified_one(tmp_path):
    root = str(tmp_path / "fs")
    _files(
        root,
        {
            "unified/cgroup.controllers": "",
            "memory/memory.limit_in_bytes": f"{V1_NO_LIMIT}\n",
            "memory/memory.usage_in_bytes": f"{5 * GIB}\n",
            "memory/api/memory.limit_in_bytes": f"{2 * GIB}\n",
            "memory/api/memory.usage_in_bytes": f"{300 * MIB}\n",
            "memory/api/memory.stat": f"cache 1\ntotal_inactive_file {100 * MIB}\n",
            "memory/api/job/memory.limit_in_bytes": f"{V1_NO_LIMIT}\n",
            "memory/api/job/memory.usage_in_bytes": f"{200 * MIB}\n",
        },
    )
    membership = _membership(tmp_path, "9:name=systemd:/\n4:memory:/api/job\n1:cpu:/\n0::/\n")
    assert cgroup_headroom_bytes(root, membership) == 2 * GIB - 200 * MIB
    # a cgroup namespace that hides the path: the root it shows is the process's cgroup
    hidden = _membership(tmp_path, "4:memory:/host/only/path\n")
    assert cgroup_headroom_bytes(root, hidden) is None  # the visible root has no limit


def test_a_reset_that_fits_the_host_but_not_a_1_gib_cgroup_is_refused(tmp_path):
    root, membership = _v2_job(tmp_path)
    need = reset_peak_bytes(_manifest(), 1)[0]  # about 1 GB: fits this host, not the cgroup
    host = available_memory_bytes()
    if host is None or host < 2 * need:
        pytest.skip("needs a host with 2 GB available")
    assert reset_problem(_manifest(), 1, 0, 1, host) is None
    available = available_bytes(root, membership)
    assert available == GIB - 60 * MIB
    problem = reset_problem(_manifest(), 1, 0, 1, available)
    assert "more than the 964.0 MiB of memory available to each of the 1 rank(s)" in problem


def _own_memory_cgroup():
    """(directory of this process's memory cgroup on this machine, cgroup version) or None."""
    with open("/proc/self/cgroup", encoding="ascii") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            return os.path.join("/sys/fs/cgroup/memory", path.lstrip("/")), 1
    for hierarchy, _, path in lines:
        if hierarchy == "0":
            return os.path.join("/sys/fs/cgroup", path.lstrip("/")), 2
    return None


def test_a_real_1_gib_cgroup_of_this_machine_bounds_what_a_process_in_it_can_get():
    own = _own_memory_cgroup()
    if own is None:
        pytest.skip("no memory cgroup")
    child = os.path.join(own[0], f"mmde-test-{os.getpid()}")
    try:
        os.mkdir(child)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here: {exc}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        limit = "memory.limit_in_bytes" if own[1] == 1 else "memory.max"
        with open(os.path.join(child, limit), "w", encoding="ascii") as f:
            f.write(str(GIB))
        with open(os.path.join(child, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(sleeper.pid))
        headroom = cgroup_headroom_bytes("/sys/fs/cgroup", f"/proc/{sleeper.pid}/cgroup")
        assert GIB - 100 * MIB < headroom <= GIB  # a sleeping Python uses a few MiB
        assert available_bytes("/sys/fs/cgroup", f"/proc/{sleeper.pid}/cgroup") <= headroom
    finally:
        sleeper.kill()
        sleeper.wait()
        os.rmdir(child)
