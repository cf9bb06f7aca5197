"""Who holds a checkpoint lock (persistence/holder.py): this process described as a holder,
whether a pid still runs, and a holder's one-line description."""

import os
import subprocess
import sys

from merlin_models_de.persistence import holder


def test_this_process_as_a_holder_is_a_holder_that_runs():
    me = holder.this_holder("tok")
    assert holder.is_holder(me) and me["pid"] == os.getpid() and me["token"] == "tok"
    runs, start = holder.process_start(me["pid"])
    assert runs and start == me["pid_start"]


def test_a_finished_process_is_not_running():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert holder.process_start(child.pid)[0] is False


def test_holders_need_a_host_and_an_integer_pid():
    assert holder.is_holder({"host": "h", "pid": 7})
    for bad in ({"host": "h", "pid": True}, {"host": "h", "pid": "7"}, {"pid": 7}, ["h", 7]):
        assert not holder.is_holder(bad)


def test_describe_names_host_pid_job_and_start_time_in_utc():
    text = holder.describe({"host": "n1", "pid": 7, "job": "42", "started": 0, "pid_ns": "x"})
    assert text == (
        "host='n1', pid=7, job='42', launch=None, started=1970-01-01 00:00:00 UTC, "
        "pid_namespace='x'"
    )
