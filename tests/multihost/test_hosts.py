"""The hosts themselves: horovodrun in h1 starts ranks over ssh on h1 and h2, each rank on its
own address; nothing of theirs listens outside the namespaces; a host that refuses ssh at
start ends the launch within seconds naming it; a killed run's leftovers are removed."""

import os
import re
import subprocess
import sys

import pytest

from tests.multihost.conftest import HOROVODRUN, IFACE, SCRIPT, horovodrun, netns

SHOW = (
    "echo rank=$HOROVOD_RANK host=$HOROVOD_HOSTNAME addr=$(ip -4 -o addr show "
    + IFACE
    + " | awk '{print $4}') gloo_iface=$HOROVOD_GLOO_IFACE; ss -ltnp | tail -n +2"
)


def _listeners(text):
    return re.findall(r"LISTEN\s+\d+\s+\d+\s+(\S+):(\d+)\s.*users:\(\(\"([^\"]+)\"", text)


def test_ranks_start_over_ssh_on_their_own_hosts(hosts, tmp_path):
    run = subprocess.run(
        [
            "bash",
            SCRIPT,
            "run",
            "h1",
            "timeout",
            "120",
            HOROVODRUN,
            "--gloo",
            "-np",
            "2",
            "-H",
            "h1:1,h2:1",
            "--network-interface",
            IFACE,
            "bash",
            "-c",
            SHOW,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "[0]<stdout>:rank=0 host=h1 addr=10.231.7.1/24 gloo_iface=mmde0" in run.stdout
    assert "[1]<stdout>:rank=1 host=h2 addr=10.231.7.2/24 gloo_iface=mmde0" in run.stdout
    h1 = _listeners("\n".join(l for l in run.stdout.splitlines() if l.startswith("[0]")))
    h2 = _listeners("\n".join(l for l in run.stdout.splitlines() if l.startswith("[1]")))
    # each sshd binds its host's address only; the one wildcard listener is horovodrun's
    # rendezvous server in h1 (Horovod 0.28 binds it to every interface of h1's namespace:
    # lo and mmde0, nothing outside)
    assert ("10.231.7.1", "22", "sshd") in h1 and ("10.231.7.2", "22", "sshd") in h2
    assert [l for l in h1 + h2 if l[0] in ("0.0.0.0", "*", "[::]")] == [
        l for l in h1 if l[2] == "horovodrun"
    ], (h1, h2)


def test_the_launcher_binds_every_server_to_the_interface_given(hosts):
    """python -m merlin_models_de.apps.tools.launch: horovodrun's rendezvous server listens on h1's
    mmde0 address, and nothing of the job listens on every interface."""
    run = subprocess.run(
        [
            "bash",
            SCRIPT,
            "run",
            "h1",
            "timeout",
            "120",
            sys.executable,
            "-m",
            "merlin_models_de.apps.tools.launch",
            "--gloo",
            "-np",
            "2",
            "-H",
            "h1:1,h2:1",
            "--network-interface",
            IFACE,
            "bash",
            "-c",
            SHOW,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    h1 = _listeners("\n".join(l for l in run.stdout.splitlines() if l.startswith("[0]")))
    h2 = _listeners("\n".join(l for l in run.stdout.splitlines() if l.startswith("[1]")))
    assert [l for l in h1 + h2 if l[0] in ("0.0.0.0", "*", "[::]")] == [], (h1, h2)
    assert [l for l in h1 if l[0] == "10.231.7.1" and l[2].startswith("python")], h1


def test_nothing_listens_or_routes_outside_the_namespaces(hosts):
    outside = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    assert "sshd" not in outside, outside
    assert (
        "10.231.7."
        not in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    )


def test_a_host_refusing_ssh_at_start_is_named_within_seconds(hosts, tmp_path):
    netns("kill", "h3")  # its sshd (and anything else in it) is gone; the link stays up
    try:
        run = horovodrun("h1:1,h3:1", 2, ["-c", "pass"], tmp_path, timeout=120)
    finally:
        assert netns("up", "3").returncode == 0  # fresh hosts for the tests after this one
    assert run.code != 0
    assert "ssh not successful for host h3:" in run.output, run.output[-3000:]
    assert "connect to host h3 port 22: Connection refused" in run.output
    assert run.seconds < 60, run.seconds  # hang guard; measured 8 s


def test_down_removes_what_a_killed_run_left_behind(tmp_path):
    env = dict(
        os.environ,
        MMDE_NETNS_PREFIX="mmdet",
        MMDE_NETNS_SUBNET="10.231.8",
        MMDE_NETNS_STATE=str(tmp_path / "state"),
    )
    why = subprocess.run(["bash", SCRIPT, "cannot"], capture_output=True, text=True, env=env)
    if why.returncode:
        pytest.skip(f"no network namespaces here: {why.stdout.strip()}")
    up = subprocess.run(
        ["bash", SCRIPT, "up", "2"], capture_output=True, text=True, env=env, timeout=60
    )
    assert up.returncode == 0, up.stderr
    # as if the run were killed: its namespaces, sshds and files stay; `down` must find them
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "mmdet-h1" in names and "mmdet-sw" in names
    subprocess.run(["bash", SCRIPT, "down"], env=env, check=True, timeout=60)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "mmdet-" not in names
    assert (
        not [n for n in os.listdir("/etc/netns") if n.startswith("mmdet-")]
        if os.path.isdir("/etc/netns")
        else True
    )
    assert not (tmp_path / "state").exists()


def test_the_hosts_check_names_a_silent_host_within_seconds(hosts):
    """A host whose link is cut answers nothing: horovodrun's own check takes 5 x 10 s
    (measured 57 s); hosts_check names it after its 3 s timeout, all hosts at once."""
    netns("cut", "h3")
    try:
        run = subprocess.run(
            [
                "bash",
                SCRIPT,
                "run",
                "h1",
                sys.executable,
                "-m",
                "merlin_models_de.apps.tools.hosts_check",
                "-H",
                "h1:1,h2:2,h3:1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        netns("mend", "h3")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "error: host h3 is unreachable over ssh: ssh: connect to host h3 port 22: "
        "Connection timed out"
    ], run.stderr
