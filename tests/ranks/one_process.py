"""Starting a one-process reference from inside a rank."""

import os

LAUNCHER_PREFIXES = ("HOROVOD", "OMPI", "PMI", "GLOO")


def one_process_env() -> dict:
    """This rank's environment without the launcher's variables: a process started with it
    runs alone (world size 1), not as another rank of this job."""
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
