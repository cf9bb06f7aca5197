"""What a test needs to start a command as a subprocess."""

import os
import sys

# the venv's horovodrun, and the environment of a command run as a subprocess (no TF notices)
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
QUIET_ENV = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")


def horovod_without_mpi() -> str | None:
    """Why MPI launchers cannot start ranks here (no OpenMPI, or a Horovod built without
    MPI), or None. Asked in a subprocess: importing Horovod here would start it."""
    import shutil
    import subprocess

    if not shutil.which("mpirun"):
        return "OpenMPI's mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    probe = subprocess.run(
        [sys.executable, "-c", "import horovod.tensorflow as h; print(h.mpi_built())"],
        capture_output=True,
        text=True,
        env=QUIET_ENV,
        timeout=120,
    )
    if probe.stdout.strip() != "True":
        return "Horovod was built without MPI (ci/setup.sh builds it with HOROVOD_WITH_MPI=1)"
    return None
