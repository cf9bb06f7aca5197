"""What a local horovodrun job of this project exposes on the network.

The project's launchers (ci/test.sh, ci/main.sh, the bench, the DLRM tests) pass
``--network-interface lo`` for local ranks: Gloo listens and connects on 127.0.0.1 and the
ranks reach the driver at 127.0.0.1. Horovod 0.28's rendezvous HTTP server always binds
0.0.0.0 (``find_port`` binds ``('', port)``; no option or variable changes it) for as long
as the job runs, unless the job is started by ``python -m merlin_models_de.apps.tools.launch``
(horovodrun with its servers bound to the interface given); the live test measures both.
"""

import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from merlin_models_de.apps.bench.runs import horovodrun

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
JOB = (
    "import time\nimport horovod.tensorflow as hvd\nimport tensorflow as tf\nhvd.init()\n"
    "hvd.allreduce(tf.constant(1.0))\ntime.sleep(3)\nhvd.allreduce(tf.constant(1.0))\n"
)


def test_project_launchers_keep_local_ranks_on_loopback():
    for script in ("ci/test.sh", "ci/main.sh"):
        text = (ROOT / script).read_text()
        launches = [l for l in text.splitlines() if re.search(r"\bhorovodrun --gloo\b", l)]
        assert launches and all("--network-interface" in l for l in launches), (script, launches)
    assert horovodrun(2, ["job"])[:8] == [
        "horovodrun",
        "--gloo",
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--network-interface",
        "lo",
    ]
    assert "--network-interface" not in horovodrun(4, ["job"], hosts="a:2,b:2")
    assert horovodrun(4, ["job"], "a:2,b:2", "eth1")[6:8] == ["--network-interface", "eth1"]


def _tree(pid):
    """``pid`` and its descendants (children of every thread: horovodrun starts ranks from
    worker threads)."""
    out = {pid}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            kids = open(f"/proc/{pid}/task/{tid}/children", encoding="utf-8").read().split()
        except OSError:
            continue
        for kid in kids:
            out |= _tree(int(kid))
    return out


def _socket_inodes(pid):
    found = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[8:-1])
    except OSError:
        pass
    return found


def _ipv4(hex_addr):
    return ".".join(str(int(hex_addr[i : i + 2], 16)) for i in (6, 4, 2, 0))


def _tcp_sockets():
    """{inode: (state, local ip, remote ip)} of IPv4 and IPv6 TCP sockets."""
    out = {}
    for path, v4 in (("/proc/net/tcp", True), ("/proc/net/tcp6", False)):
        try:
            lines = open(path, encoding="utf-8").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote = f[1].split(":")[0], f[2].split(":")[0]
            state = {"0A": "LISTEN", "01": "ESTABLISHED"}.get(f[3])
            if state:
                out[f[9]] = (
                    state,
                    _ipv4(local) if v4 else f"[{local}]",
                    _ipv4(remote) if v4 else f"[{remote}]",
                )
    return out


def _watch(proc, seen, stop):
    while not stop.is_set() and proc.poll() is None:
        sockets = _tcp_sockets()
        for pid in _tree(proc.pid):
            try:
                name = (
                    "launcher"
                    if pid == proc.pid
                    else open(f"/proc/{pid}/comm", encoding="utf-8").read().strip()
                )
            except OSError:
                continue
            for inode in _socket_inodes(pid) & set(sockets):
                seen.add((name, *sockets[inode]))
        time.sleep(0.005)  # a rank's Gloo listener lives only while the ranks connect


@pytest.mark.parametrize(
    "launcher",
    [pytest.param("horovodrun", marks=pytest.mark.full), "merlin_models_de.apps.tools.launch"],
)
def test_local_job_listens_on_loopback(launcher):
    """Gloo's ranks stay on loopback either way; horovodrun's rendezvous server listens on
    every interface, this package's launcher binds it to the interface given."""
    args = horovodrun(2, [sys.executable, "-c", JOB])[1:]
    cmd = ([HOROVODRUN] if launcher == "horovodrun" else [sys.executable, "-m", launcher]) + args
    seen, stop = set(), threading.Event()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3"),
    )
    watcher = threading.Thread(target=_watch, args=(proc, seen, stop), daemon=True)
    watcher.start()
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        stop.set()
        proc.kill()
    watcher.join()
    assert proc.returncode == 0, output[-3000:]
    ranks = {s for s in seen if s[0] != "launcher"}
    launched = {s for s in seen if s[0] == "launcher"}
    # Gloo: every rank's listening socket and connection stays on loopback
    assert any(state == "LISTEN" for _, state, _, _ in ranks), seen
    assert {local for _, _, local, _ in ranks} == {"127.0.0.1"}, seen
    assert {remote for _, state, _, remote in ranks if state == "ESTABLISHED"} <= {"127.0.0.1"}
    # the rendezvous server: every interface with horovodrun (no bind option), lo's address
    # with the launcher
    listening = {local for _, state, local, _ in launched if state == "LISTEN"}
    assert listening == ({"0.0.0.0"} if launcher == "horovodrun" else {"127.0.0.1"}), seen
