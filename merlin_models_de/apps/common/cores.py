"""How a rank's threads use its host's cores: TF's pool sizes, a share of the cores for each
rank, and Horovod's threads kept from preempting the rank's compute on that share.

Example:
    >>> threads = configure_threads(None)  # doctest: +SKIP
"""

from __future__ import annotations

import os

import tensorflow as tf

from merlin_models_de import comm, launchers

# no wake-up preemption (see demote_horovod_threads); None where the OS has no such policy
_HOROVOD_POLICY = getattr(os, "SCHED_BATCH", None)
# Horovod's coordination cycle (HOROVOD_CYCLE_TIME, ms) where its threads run at that policy:
# each exchange waits for the loop's next cycle, and the shorter cycle's extra wake-ups no
# longer preempt the compute (docs/design.md, "Measured decisions")
DEMOTED_CYCLE_TIME_MS = "0.2"


def core_share(allowed, local_rank: int, local_size: int) -> list[int] | None:
    """This rank's cores: an equal slice, by its index on the host, of the cores the process
    may use, disjoint from the other ranks' slices; None with one rank or fewer cores than
    ranks (nothing to split).

    Example:
        >>> core_share({0, 1, 2, 3}, 1, 2)
        [2, 3]
    """
    if local_size < 2 or len(allowed) < local_size:
        return None
    per = len(allowed) // local_size
    return sorted(allowed)[local_rank * per : (local_rank + 1) * per]


def bind_to_core_share() -> list[int] | None:
    """Binds every thread of this process (and those it starts later) to its
    :func:`core_share`; returns the cores, or None where nothing was split.

    Ranks that share a host's cores otherwise migrate between them: each wait in an exchange
    hands a core to another rank's thread, and the step resumes with cold caches. Measured on
    2 ranks of a 2-core host: +16% samples/s (docs/benchmarks.md)."""
    share = core_share(
        os.sched_getaffinity(0), launchers.launch_local_rank(), launchers.launch_env()[2]
    )
    if share is None:
        return None
    for tid in os.listdir("/proc/self/task"):  # threads already running (imports start some)
        try:
            os.sched_setaffinity(int(tid), share)
        except OSError:  # a thread that just ended
            pass
    return share


def demote_horovod_threads() -> int:
    """Initializes Horovod (under ``horovodrun``) and moves its threads to ``SCHED_BATCH``;
    returns how many threads moved (0 without Horovod, with a GPU, or off Linux).

    Horovod's coordination loop wakes every cycle (1 ms by default), and at the default
    policy each wake-up preempts the rank's compute on the core they share: about a thousand
    preemptions a second, system CPU time 0.009 s per 1000 samples on 2 bound ranks against
    0.002 after the move (docs/benchmarks.md). ``SCHED_BATCH`` keeps the threads' fair share
    of the core (they never starve: an exchange still completes while compute runs) and only
    drops the wake-up preemption. So Horovod starts here with a shorter cycle,
    :data:`DEMOTED_CYCLE_TIME_MS`, unless the user set ``HOROVOD_CYCLE_TIME``, asked Horovod
    to tune it (``HOROVOD_AUTOTUNE``: a cycle set in the environment is one it keeps fixed) or
    Horovod already runs. Not where TensorFlow sees a GPU: there the loop launches the GPU's
    collectives and its wake-up latency is on the step's critical path.
    """
    if _HOROVOD_POLICY is None or tf.config.list_physical_devices("GPU"):
        return 0
    tuned = os.environ.get("HOROVOD_AUTOTUNE", "0") not in ("", "0")
    defaults = {} if tuned else {"HOROVOD_CYCLE_TIME": DEMOTED_CYCLE_TIME_MS}
    if comm.hvd(defaults=defaults) is None:
        return 0
    moved = 0
    for tid in comm.horovod_threads():
        try:
            os.sched_setscheduler(tid, _HOROVOD_POLICY, os.sched_param(0))
            moved += 1
        except OSError:  # a thread that ended, or a policy this kernel refuses
            pass
    return moved


def configure_threads(cpu_threads: int | None, bind: bool = True) -> int:
    """TF threads per rank: the host's cores shared among its ranks (oversubscribed TF pools on
    a shared host cost more than the lost parallelism). Without ``cpu_threads`` (the share
    decided here) and with ``bind``, each rank is also bound to its own cores
    (:func:`bind_to_core_share`) and Horovod's threads there yield to its compute
    (:func:`demote_horovod_threads`); elastic runs do not bind: their ranks per host change."""
    threads = cpu_threads or max(1, len(os.sched_getaffinity(0)) // launchers.launch_env()[2])
    bound = cpu_threads is None and bind and bind_to_core_share() is not None
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # TF already running in this process (run() called from Python)
        threads = tf.config.threading.get_intra_op_parallelism_threads()
    if bound:
        demote_horovod_threads()
    return threads
