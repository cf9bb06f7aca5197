"""/proc's answers about a process (runtime/processes.py): this one runs, a reaped child is
gone, a stopped child says so, and a pid that is not one is not guessed at."""

import os
import signal
import subprocess
import sys

from merlin_models_de.runtime.processes import pid_namespace, process_stat


def test_a_process_is_seen_running_stopped_and_gone():
    state, start = process_stat(os.getpid())
    assert state in ("R", "S") and start > 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        os.waitpid(child.pid, os.WUNTRACED)
        assert process_stat(child.pid)[0] == "T"
    finally:
        child.kill()
        child.wait()
    assert process_stat(child.pid) == (None, None)
    assert process_stat("not a pid") == ("?", None)
    assert pid_namespace().startswith("pid:[")
