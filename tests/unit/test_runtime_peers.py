"""Which rank a healthy rank names when Horovod shut down under it: the peers on its host
that are stopped or gone, else the peers it cannot see, with their pid and host."""

import os
import signal
import subprocess
import sys

import pytest

from merlin_models_de.runtime import peers

SHUT_DOWN = (
    "Graph execution error:\nNode: 'model/embeddings/mmde_embeddings_1a2b_ids'\nHorovod has "
    "been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "allreduce, allgather or broadcast a tensor after one of the ranks finished execution."
)


@pytest.fixture
def processes():
    """Peers on this host as real processes: started, and killed at the end."""
    started = []

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        started.append(proc)
        host, namespace, _, _ = peers.identity()
        return proc, (host, namespace, proc.pid, None)  # no start time: the pid alone

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_stopped_peer_on_this_host_is_named_among_running_ones(processes):
    running, running_id = processes()
    stopped, stopped_id = processes()
    stopped.send_signal(signal.SIGSTOP)
    os.waitpid(stopped.pid, os.WUNTRACED)  # returns once it is stopped
    world = [peers.identity(), running_id, stopped_id, ("elsewhere", "pid:[1]", 7, 1)]
    message = peers.silent_rank_message(SHUT_DOWN, 0, 4, world)
    assert message.startswith(
        f"Rank 2 (pid {stopped.pid} on host {stopped_id[0]}) stopped answering: its process is "
        "stopped (SIGSTOP, or SIGTSTP: Ctrl-Z). Rank 0 (this one) waited for it in the "
        "collective 'mmde_embeddings_1a2b_ids'"
    ), message
    assert message.endswith(SHUT_DOWN)


def test_an_exited_peer_is_named_and_unseen_peers_when_nothing_here_is_wrong(processes):
    gone, gone_id = processes()
    gone.kill()
    gone.wait()
    here = peers.identity()
    remote = [("h2", "pid:[1]", 11, 5), ("h3", "pid:[1]", 12, 5)]
    assert peers.silent_ranks(1, 4, [gone_id, here] + remote) == [
        (0, f" (pid {gone.pid} on host {here[0]})", "has exited")
    ]
    _, running_id = processes()
    assert peers.silent_ranks(1, 4, [running_id, here] + remote) == [
        (2, " (pid 11 on host h2)", None),
        (3, " (pid 12 on host h3)", None),
    ]
    # no exchange yet: with 2 ranks the other one is still named
    assert peers.silent_rank_message(SHUT_DOWN, 1, 2, []).startswith("Rank 0 stopped answering.")


def test_other_failures_are_left_as_they_are():
    assert peers.silent_rank_message("Input to reshape is a tensor with 3 values", 0, 2, []) is None
    assert peers.silent_rank_message(SHUT_DOWN, 0, 1, []) is None
