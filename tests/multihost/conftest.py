"""Multi-host tests: "hosts" h1..h3 are network namespaces joined by a bridge, each with its own
sshd (scripts/netns_hosts.sh), and horovodrun runs in h1 and starts the other hosts' ranks
over ssh, as on a cluster. The hosts are made once per session and removed afterwards, also
when a test fails or the session is interrupted (and `up` first removes what a killed run
left behind). Where namespaces cannot be made (not root, no sshd, no permission), every test
here skips with the reason.

Every job runs under `timeout`, and each rank under a watchdog (jobs/watchdog.py) that names
its rank and host when it is stuck.
"""

import atexit
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "netns_hosts.sh")
HOSTS = 3
IFACE = "mmde0"
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
# horovodrun whose servers listen on --network-interface only (the jobs' launcher)
LAUNCH = [sys.executable, "-m", "merlin_models_de.apps.tools.launch"]


def netns(*args, timeout=60, check=True):
    return subprocess.run(
        ["bash", SCRIPT, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def _down(*_):
    netns("down", check=False)


@pytest.fixture(scope="session")
def hosts():
    """Makes h1..h3 (or skips with the reason it cannot); removes them at the end."""
    why = netns("cannot", check=False)
    if why.returncode != 0:
        pytest.skip(f"no network namespaces here: {why.stdout.strip() or why.stderr.strip()}")
    atexit.register(_down)
    previous = signal.signal(signal.SIGTERM, lambda *a: (_down(), sys.exit(143)))
    try:
        up = netns("up", str(HOSTS), check=False)
        assert up.returncode == 0, up.stdout + up.stderr
        yield [f"h{k}" for k in range(1, HOSTS + 1)]
    finally:
        _down()
        signal.signal(signal.SIGTERM, previous)


class Job:
    """A job started in h1 by horovodrun (through merlin_models_de.apps.tools.launch: its servers
    bound to the hosts' interface) (Popen), its output collected in a file (no
    ``hosts_arg``: an elastic job, its hosts from ``--host-discovery-script`` in ``extra``)."""

    def __init__(self, hosts_arg, np, argv, log, timeout, extra=(), env=None, iface=IFACE):
        self.log_path, self.timeout = log, timeout
        cmd = [
            "bash",
            SCRIPT,
            "run",
            "h1",
            "timeout",
            "--kill-after=10",
            str(timeout),
            *LAUNCH,
            "--gloo",
            "-np",
            str(np),
            *(["-H", hosts_arg] if hosts_arg else []),
            "--network-interface",
            iface,
            *extra,
            sys.executable,
            *argv,
        ]
        self.log = open(log, "w", encoding="utf-8")
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", **(env or {})),
        )

    def wait_for(self, ready, what):
        """Waits until ``ready()`` holds while the job runs (at most 300 s)."""
        while not ready():
            assert self.proc.poll() is None, open(self.log_path).read()[-4000:]
            assert time.monotonic() - self.start < 300, f"the job never reached {what}"
            time.sleep(0.1)

    def wait(self):
        try:
            code = self.proc.wait(self.timeout + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
        self.seconds = time.monotonic() - self.start
        self.output = pathlib.Path(self.log_path).read_text(encoding="utf-8", errors="replace")
        self.code = code
        return self


def horovodrun(hosts_arg, np, argv, tmp_path, timeout=300, **kw):
    """Runs a job to its end; returns it with .code, .output and .seconds."""
    return Job(hosts_arg, np, argv, str(tmp_path / "job.log"), timeout, **kw).wait()
