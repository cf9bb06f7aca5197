"""A rank's threads on the host's cores (apps/common/cores.py): an equal disjoint share for
each local rank, every thread of a bound rank on it, Horovod's threads at SCHED_BATCH."""

import json
import os
import subprocess
import sys

import pytest

from tests.commands.launch import HOROVODRUN
from tests.commands.launch import QUIET_ENV as ENV


@pytest.mark.parametrize(
    "allowed, local_rank, local_size, share",
    [
        ({0, 1}, 0, 2, [0]),
        ({0, 1}, 1, 2, [1]),
        ({4, 5, 6, 7, 8}, 1, 2, [6, 7]),  # a cpuset's cores, split evenly (one left over)
        ({0, 1, 2, 3}, 0, 1, None),  # one rank: nothing to split
        ({0}, 1, 2, None),
    ],
)  # fewer cores than ranks: oversubscribed, not bound
def test_each_rank_gets_an_equal_disjoint_share_of_the_cores(
    allowed, local_rank, local_size, share
):
    from merlin_models_de.apps.common.cores import core_share

    assert core_share(allowed, local_rank, local_size) == share


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to split")
@pytest.mark.parametrize(
    "user_env, cycle",
    [({}, "0.2"), ({"HOROVOD_CYCLE_TIME": "3"}, "3"), ({"HOROVOD_AUTOTUNE": "1"}, None)],
)
def test_horovods_threads_stop_preempting_the_compute_of_a_bound_rank(user_env, cycle):
    """On 2 real ranks: the threads Horovod's init started (and only those) run at
    SCHED_BATCH after the command's thread setup, Horovod started with the shorter cycle
    unless the user set one or asked Horovod to tune it, and the collectives still work."""
    code = (
        "import json, os\n"
        "from merlin_models_de import comm\n"
        "from merlin_models_de.apps.common.cores import configure_threads\n"
        "configure_threads(None)\n"
        "import tensorflow as tf\n"
        "total = float(comm.allreduce(tf.constant(1.0), op='sum'))\n"
        "ours = set(comm.horovod_threads())\n"
        "policy = {int(t): os.sched_getscheduler(int(t))\n"
        "          for t in os.listdir('/proc/self/task')}\n"
        "print('POLICIES', json.dumps({'total': total, 'horovod': sorted({policy[t] for t in "
        "ours}), 'count': len(ours), 'others': sorted({p for t, p in policy.items() "
        "if t not in ours}), 'cycle': os.environ.get('HOROVOD_CYCLE_TIME')}))"
    )
    env = {k: v for k, v in ENV.items() if k not in ("HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")}
    env.update(user_env)
    run = subprocess.run(
        [
            HOROVODRUN,
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--network-interface",
            "lo",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    reports = [
        json.loads(line.split("POLICIES ", 1)[1])
        for line in run.stdout.splitlines()
        if "POLICIES " in line
    ]
    assert len(reports) == 2, run.stdout[-3000:]
    for report in reports:
        assert report["count"] >= 1  # its coordination loop at least
        assert report == {
            "total": 2.0,
            "horovod": [os.SCHED_BATCH],
            "count": report["count"],
            "others": [os.SCHED_OTHER],
            "cycle": cycle,
        }


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to split")
def test_the_command_binds_every_thread_of_a_rank_to_its_share():
    """As horovodrun's second local rank of 2: the threads running before the call and those
    started after it (TensorFlow's pools) all run on that rank's cores only."""
    cores = sorted(os.sched_getaffinity(0))
    mine = cores[len(cores) // 2 : 2 * (len(cores) // 2)]
    code = (
        "import json, os, threading\n"
        "from merlin_models_de.apps.common.cores import configure_threads\n"
        "threads = configure_threads(None)\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "import tensorflow as tf; tf.constant(1.0) + 1.0\n"
        "print(json.dumps({'threads': threads, 'cores': sorted({tuple(sorted("
        "os.sched_getaffinity(int(tid)))) for tid in os.listdir('/proc/self/task')})}))"
    )
    env = dict(ENV, HOROVOD_LOCAL_RANK="1", HOROVOD_LOCAL_SIZE="2")
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"threads": len(mine), "cores": [mine]}
