"""A rank that makes no progress for MMDE_WATCHDOG seconds prints "rank R on host H stuck for
S s", dumps its stacks and exits 3, which makes horovodrun end the job: a hang never stalls
a test. Jobs call ``progress()`` at each step."""

import faulthandler
import os
import socket
import sys
import threading
import time

_last = [time.monotonic()]


def host():
    """The host name horovodrun (-H) or SLURM gave this rank, else the machine's."""
    env = os.environ
    return env.get("HOROVOD_HOSTNAME") or env.get("SLURMD_NODENAME") or socket.gethostname()


def progress():
    _last[0] = time.monotonic()


def start(limit=None):
    limit = float(limit or os.environ.get("MMDE_WATCHDOG", "300"))
    from merlin_models_de.launchers import launch_env  # no TensorFlow, no Horovod: safe this early

    rank = launch_env()[1]

    def watch():
        while True:
            time.sleep(1)
            idle = time.monotonic() - _last[0]
            if idle > limit:
                sys.stderr.write(
                    f"\n[merlin-models-de] rank {rank} on host "
                    f"{host()} stuck for {idle:.0f}s; its stacks:\n"
                )
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
