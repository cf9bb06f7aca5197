"""SLURM on the namespace hosts (scripts/slurm_hosts.sh: slurmctld in h1, a slurmd in every
host, munge, one partition): the fit oracle's DLRM as 2 nodes x 1 task started by `srun`
(MPI through PMIx) equals one process fed the same global batches, and an `sbatch` job of 2
nodes runs the DLRM command through `srun`. Skipped, saying why, where the cluster cannot be
made (not root, no namespaces, SLURM or munge missing) or Horovod has no MPI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.commands.launch import horovod_without_mpi
from tests.multihost.conftest import ROOT
from tests.multihost.jobs.reference import assert_same_weights, fit_spec, one_process

SLURM = str(ROOT / "scripts" / "slurm_hosts.sh")
PER_RANK, STEPS = 16, 3
ENV = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")


def slurm(*argv, timeout=300):
    """``scripts/slurm_hosts.sh ARGV`` (``run CMD`` runs CMD in h1 with the cluster's
    configuration), under a timeout."""
    cmd = ["timeout", "--kill-after=10", str(timeout), "bash", SLURM, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV)


@pytest.fixture(scope="module")
def cluster(hosts):
    """SLURM started on h1 and h2 of the session's hosts; stopped afterwards."""
    why = slurm("cannot", timeout=60)
    if why.returncode != 0:
        pytest.skip(f"no SLURM cluster here: {why.stdout.strip() or why.stderr.strip()}")
    why_not = horovod_without_mpi()
    if why_not:
        pytest.skip(why_not)
    started = slurm("start", "2", timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield
    finally:
        slurm("stop", timeout=60)


def test_fit_started_by_srun_on_two_nodes_equals_one_process(cluster, tmp_path):
    src, ref_path, ref = one_process(tmp_path, fit_spec(2, PER_RANK), PER_RANK, STEPS)
    job = slurm(
        "run",
        *["srun", "-N", "2", "-n", "2", "--mpi=pmix", "--kill-on-bad-exit=1"],
        *[sys.executable, "-m", "tests.multihost.jobs.fit_job", src, ref_path, str(tmp_path)],
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "merlin_models_de: 2 ranks started by srun, Horovod over MPI" in job.stderr
    got = dict(np.load(tmp_path / "final.npz"))
    assert list(got["hosts"]) == ["h1", "h2"]
    assert_same_weights(got, ref, "final/")
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-4, atol=1e-5)


def test_an_sbatch_job_of_two_nodes_runs_the_dlrm_command_through_srun(cluster, tmp_path):
    report = tmp_path / "report.json"
    script = tmp_path / "dlrm.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --ntasks-per-node=1\n"
        f"#SBATCH --output={tmp_path}/slurm-%j.out\n"
        f"srun --mpi=pmix {sys.executable} -m merlin_models_de.apps.dlrm --rows 1024 "
        "--epochs 1 --max-table-rows 1000 --batch-size 64 --dim 8 --quiet "
        f"--report {report}\n"
    )
    job = slurm("run", "sbatch", "--wait", "--parsable", str(script))
    output = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert job.returncode == 0, job.stdout + job.stderr + output[-3000:]
    assert "merlin_models_de: 2 ranks started by srun, Horovod over MPI" in output
    assert output.count("epoch 1:") == 1, output[-3000:]  # rank 0 reports
    assert json.loads(report.read_text())["world_size"] == 2
