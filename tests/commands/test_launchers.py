"""Ranks started by MPI launchers on one host: the fit oracle's DLRM under plain `mpirun` (and
`horovodrun --mpi`) equals one process fed the same global batches, the DLRM command runs under
`mpirun`, and a launch whose world Horovod does not see fails on every rank, naming both worlds
and the fix. Skipped, saying why, where OpenMPI or Horovod's MPI is missing (ci/setup.sh
installs both)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.commands.launch import HOROVODRUN, horovod_without_mpi
from tests.commands.launch import QUIET_ENV as ENV
from tests.multihost.jobs.reference import assert_same_weights, fit_spec, one_process

PER_RANK, STEPS = 16, 3
FIT_JOB = [sys.executable, "-m", "tests.multihost.jobs.fit_job"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


WHY_NO_MPI = horovod_without_mpi()
pytestmark = pytest.mark.skipif(bool(WHY_NO_MPI), reason=str(WHY_NO_MPI))


def mpirun(np_, argv, timeout=300):
    """``mpirun -np N argv`` on this host (ranks not bound to cores: the machine is shared)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = ["timeout", "--kill-after=10", str(timeout), "mpirun", *root, "-np", str(np_)]
    cmd += ["--oversubscribe", "--bind-to", "none", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)


def _horovodrun_mpi(np_, argv, timeout=300):
    cmd = ["timeout", "--kill-after=10", str(timeout), HOROVODRUN, "--mpi", "-np", str(np_)]
    cmd += ["-H", f"localhost:{np_}", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)


# each ~40 s, full tier: the CI tier's MPI oracle is srun's (tests/multihost/test_slurm.py),
# and its mpirun launches are the wrong-world cases below
@pytest.mark.full
@pytest.mark.parametrize("launch", ["mpirun", "horovodrun --mpi"])
def test_fit_launched_by_mpi_equals_one_process(tmp_path, launch):
    src, ref_path, ref = one_process(tmp_path, fit_spec(2, PER_RANK), PER_RANK, STEPS)
    argv = [*FIT_JOB, src, ref_path, str(tmp_path)]
    job = mpirun(2, argv) if launch == "mpirun" else _horovodrun_mpi(2, argv)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "merlin_models_de: 2 ranks started by mpirun, Horovod over MPI" in job.stderr
    got = dict(np.load(tmp_path / "final.npz"))
    assert_same_weights(got, ref, "final/")
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-4, atol=1e-5)
    assert not np.allclose(got["table/C1"], ref["initial/table/C1"])  # it trained


@pytest.mark.full  # ~27 s; tests/multihost/test_slurm.py runs the command over MPI (srun)
def test_the_dlrm_command_runs_under_mpirun(tmp_path):
    report = tmp_path / "report.json"
    run = mpirun(
        2,
        [sys.executable, "-m", "merlin_models_de.apps.dlrm", "--rows", "1024", "--epochs", "1"]
        + ["--max-table-rows", "1000", "--batch-size", "64", "--dim", "8", "--quiet"]
        + ["--report", str(report)],
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("epoch 1:") == 1  # rank 0 reports
    assert '"world_size": 2' in report.read_text()


@pytest.mark.parametrize(
    "variables, fix",
    [
        # mpirun starts 2 ranks, but Horovod is told to use Gloo, which has no rendezvous here:
        # each rank alone would train on its half of the data as a world of 1
        (
            ["HOROVOD_CONTROLLER=gloo", "HOROVOD_CPU_OPERATIONS=gloo"],
            "mpirun started rank {rank} of 2, but Horovod (Gloo) sees rank 0 of 1:"
            " HOROVOD_CONTROLLER='gloo' chose Gloo: unset it",
        ),
        # horovodrun's variables left in the job's environment (a job script exports them)
        # beside the launcher's that really started the ranks
        (
            ["HOROVOD_RANK=0", "HOROVOD_SIZE=1"],
            "horovodrun started rank 0 of 1, but Horovod (MPI) sees rank {rank} of 2:"
            " HOROVOD_RANK='0' and HOROVOD_SIZE='1' (horovodrun's) are set beside mpirun's,"
            " whose world Horovod sees: unset the stale horovodrun variables",
        ),
    ],
    ids=["gloo-asked", "stale-horovodrun-variables"],
)
def test_a_world_horovod_does_not_see_fails_on_every_rank(variables, fix):
    run = mpirun(
        2,
        [arg for v in variables for arg in ("-x", v)]
        + [sys.executable, "-c", "from merlin_models_de import comm; comm.size()"],
        timeout=120,
    )
    assert run.returncode != 0
    for rank in (0, 1):
        assert f"LaunchError: {fix.format(rank=rank)}" in run.stderr, run.stderr[-3000:]
