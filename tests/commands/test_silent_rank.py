"""A rank that stops answering mid-step (SIGSTOP): the job ends within Gloo's timeout, and the
healthy rank's error names the stopped rank, its pid and its host, not itself."""

import os
import signal
import socket
import subprocess
import sys
import time

from tests.commands.launch import HOROVODRUN, QUIET_ENV

GLOO_TIMEOUT = 3  # seconds Gloo waits for a peer (30 by default)


def test_the_healthy_rank_names_the_rank_that_stopped(tmp_path):
    job = subprocess.Popen(
        [HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface", "lo"]
        + [sys.executable, "-m", "tests.commands.silent_rank_job", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(QUIET_ENV, HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT)),
        start_new_session=True,  # its own process group: everything it started is killed below
    )
    start = time.monotonic()
    try:
        output, _ = job.communicate(timeout=120)  # a hang is a failure
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        stopped = tmp_path / "stopped.pid"
        if stopped.exists():  # horovodrun kills it; make sure nothing is left behind
            try:
                os.kill(int(stopped.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(f"the job ended {time.monotonic() - start:.1f} s after its start")
    assert job.returncode != 0 and stopped.exists(), output[-3000:]
    pid = int(stopped.read_text())
    named = (
        f"[0]<stderr>:tensorflow.python.framework.errors_impl.UnknownError: Rank 1 (pid {pid} "
        f"on host {socket.gethostname()}) stopped answering: its process is stopped (SIGSTOP"
    )
    assert named in output, output[-3000:]
    assert "Rank 0 (this one) waited for it in the collective 'mmde_" in output, output[-3000:]
