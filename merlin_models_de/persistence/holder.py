"""Who holds a checkpoint lock, and whether that process still runs (no TensorFlow here).

A lock's holder is recorded as host, boot id, PID namespace, pid and the pid's start time,
launch, job and wall-clock start (:func:`this_holder`). A pid means something only on the
host and in the PID namespace that recorded it; :func:`process_start` tells whether a pid of
this namespace runs, and since when.
"""

from __future__ import annotations

import os
import socket
import time

from merlin_models_de.runtime.processes import pid_namespace, process_stat

_JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")


def this_holder(token: str) -> dict:
    """This process as a lock's holder, with ``token`` (which tells its own lock apart)."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid_ns": pid_namespace(),
        "pid": pid,
        "pid_start": process_start(pid)[1],
        "launch": _launch_id(),
        "job": _job_id(),
        "started": time.time(),
        "token": token,
    }


def _launch_id() -> str | None:
    """One id per running launch: horovodrun's rendezvous address (one per running
    horovodrun, kept across an elastic job's resets), else the SLURM job step; else None."""
    rendezvous = [os.environ.get(f"HOROVOD_GLOO_RENDEZVOUS_{k}") for k in ("ADDR", "PORT")]
    if all(rendezvous):
        return "horovodrun@{}:{}".format(*rendezvous)
    step = [os.environ.get(k) for k in ("SLURM_JOB_ID", "SLURM_STEP_ID")]
    return "slurm-step@{}.{}".format(*step) if all(step) else None


def _job_id() -> str | None:
    """The scheduler's job id (for the messages: it names an allocation, not a launch)."""
    return next((os.environ[v] for v in _JOB_VARIABLES if os.environ.get(v)), None)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def boot_time() -> float | None:
    """When this host booted (seconds since the epoch, ``btime`` of ``/proc/stat``)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_start(pid) -> tuple[bool, int | None]:
    """``(runs, start)`` of process ``pid`` on this host: whether it runs (a zombie does not)
    and its start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), None where
    the system does not say."""
    state, start = process_stat(pid)
    if state is None:
        return False, None
    if state == "?":  # /proc does not say: ask the kernel whether the pid exists
        return _alive(pid), None
    return state != "Z", start


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, TypeError):
        return True  # exists (owned by someone else), or unreadable: assume it is alive
    return True


def describe(holder: dict) -> str:
    """``host=..., pid=..., job=..., launch=..., started=<UTC time>`` of a lock's holder."""
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, (int, float))
        else repr(started)
    )
    return (
        f"host={holder.get('host')!r}, pid={holder.get('pid')!r}, "
        f"job={holder.get('job')!r}, launch={holder.get('launch')!r}, started={when}"
        + (f", pid_namespace={holder['pid_ns']!r}" if holder.get("pid_ns") else "")
    )


def is_holder(value) -> bool:
    """True for a lock's content that names a holder (a host and a pid)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("pid"), int)
        and not isinstance(value.get("pid"), bool)
    )
