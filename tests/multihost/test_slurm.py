"""SLURM on the namespace hosts (scripts/slurm_hosts.sh: slurmctld in h1, a slurmd in every
host, munge, one partition): the fit oracle's DLRM as 2 nodes x 1 task started by `srun`
(MPI through PMIx) equals one process fed the same global batches, and an `sbatch` job of 2
nodes runs the DLRM command through `srun`. Skipped, saying why, where the cluster cannot be
made (not root, no namespaces, SLURM or munge missing) or Horovod has no MPI."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.commands.launch import horovod_without_mpi
from tests.multihost.conftest import ROOT, netns
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
    started = "2 ranks started by srun (rank 0 on h1, rank 1 on h2), Horovod over MPI"
    assert f"merlin_models_de: {started}" in job.stderr
    got = dict(np.load(tmp_path / "final.npz"))
    assert list(got["hosts"]) == ["h1", "h2"]
    assert_same_weights(got, ref, "final/")
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-4, atol=1e-5)


DLRM = [sys.executable, "-m", "merlin_models_de.apps.dlrm", "--max-table-rows", "1000"]
DLRM += ["--batch-size", "64", "--dim", "8", "--quiet"]
LOST_BOUND = 60  # seconds from a node's death to the job's end: SlurmdTimeout=10 + pings


def sbatch(tmp_path, name, header, *commands, wait=False):
    """Submits a batch script of ``commands`` (each a list) with ``#SBATCH header``; returns
    its job id, its output file and sbatch's result."""
    script = tmp_path / f"{name}.sbatch"
    out = tmp_path / f"{name}.out"
    lines = [" ".join(map(str, c)) for c in commands]
    script.write_text(f"#!/bin/bash\n#SBATCH {header} --output={out}\n" + "\n".join(lines))
    job = slurm("run", "sbatch", "--parsable", *(["--wait"] if wait else []), str(script))
    assert job.returncode == 0 or wait, job.stdout + job.stderr
    return job.stdout.strip().split(";")[0], out, job


def job_state(job_id) -> str:
    shown = slurm("run", "scontrol", "show", "job", job_id, timeout=30).stdout
    return shown.split("JobState=")[1].split()[0] if "JobState=" in shown else "GONE"


def latest_step(ckpt) -> int:
    from merlin_models_de.persistence.layout import parse_name, read_latest

    path = read_latest(str(ckpt)) if ckpt.exists() else None
    return parse_name(os.path.basename(path))[0] if path else -1


def test_a_node_lost_mid_job_ends_it_and_a_job_on_the_node_left_resumes(cluster, tmp_path):
    """An sbatch job of 2 nodes runs the DLRM command through srun, committing a sharded
    checkpoint every 5 steps; h2 dies (every process of the host, its slurmd too). SLURM
    ends the job, naming the node; the start line names the node's rank; a job of 1 node
    resumes from the last commit and finishes (2 ranks' shards into 1)."""
    ckpt, report = tmp_path / "ckpt", tmp_path / "report.json"
    train = [*DLRM, "--rows", "16000", "--epochs", "1", "--checkpoint-dir", ckpt]
    first, out, _ = sbatch(
        tmp_path,
        "first",
        "--nodes=2 --ntasks-per-node=1 --no-requeue",
        ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", *train, "--checkpoint-every", "5"],
    )
    try:
        t0 = time.monotonic()
        while latest_step(ckpt) < 10:  # two commits, of 125 steps: the job is well in
            assert job_state(first) in ("PENDING", "RUNNING"), out.read_text()[-3000:]
            assert time.monotonic() - t0 < 240, "no second checkpoint in 240 s"
            time.sleep(0.5)
        netns("kill", "h2")
        lost = time.monotonic()
        while job_state(first) in ("PENDING", "RUNNING", "COMPLETING"):
            assert time.monotonic() - lost < LOST_BOUND, f"the job runs {LOST_BOUND} s on"
            time.sleep(0.5)
        ended = time.monotonic() - lost
        output = out.read_text()
        print(f"the job ended {ended:.1f} s after h2 died")
        assert "merlin_models_de: 2 ranks started by srun (rank 0 on h1, rank 1 on h2)" in output
        assert "srun: error: Node failure on h2" in output, output[-3000:]
        assert "Report:" not in output  # it did not finish
        committed = latest_step(ckpt)
        _, out2, job = sbatch(
            tmp_path, "second", "--nodes=1 --ntasks=1", ["srun", "--mpi=pmix", *train,
            "--report", report], wait=True,
        )  # fmt: skip
        output = out2.read_text()
        assert job.returncode == 0, output[-3000:]
        assert "merlin_models_de: 1 ranks started by srun (rank 0 on h1)" in output
        assert f"Resumed from {ckpt}/ckpt-{committed:09d} (step {committed}," in output
        assert json.loads(report.read_text())["world_size"] == 1
        assert not [p for p in os.listdir(ckpt) if p.startswith(".tmp")]  # no half save left
    finally:
        assert netns("revive", "h2").returncode == 0  # the host boots again
        assert slurm("start", "2", timeout=120).returncode == 0


@pytest.mark.full  # ~45 s
def test_horovodrun_in_a_batch_script_starts_the_allocations_ranks(cluster, tmp_path):
    """horovodrun (the package's launch tool) inside an sbatch script, no hosts given: the
    ranks go where the allocation's tasks are, over ssh, with Gloo."""
    report = tmp_path / "report.json"
    launch = [sys.executable, "-m", "merlin_models_de.apps.tools.launch", "--gloo"]
    _, out, job = sbatch(
        tmp_path, "horovodrun", "--nodes=2 --ntasks-per-node=1",
        [*launch, "--network-interface", "mmde0", *DLRM, "--rows", "1024", "--epochs", "1",
         "--report", report], wait=True,
    )  # fmt: skip
    output = out.read_text()
    assert job.returncode == 0, output[-3000:]
    assert "note: hosts from the SLURM allocation: -H h1:1,h2:1" in output
    assert "merlin_models_de: 2 ranks started by horovodrun, Horovod over Gloo" in output
    assert json.loads(report.read_text())["world_size"] == 2


@pytest.mark.full  # ~40 s
def test_two_job_steps_on_one_checkpoint_directory(cluster, tmp_path):
    """Two job steps of one allocation write one checkpoint directory: while the first holds
    its lock, the second's save is refused on every rank, naming the first step
    (docs/checkpoints.md: the steps of one allocation share a job id, not a launch)."""
    ckpt = tmp_path / "ckpt"
    hold = "from merlin_models_de.persistence.lock import DirectoryLock as L; import time\n"
    hold += f"with L({str(ckpt)!r}): open({str(tmp_path / 'held')!r}, 'w').close(); "
    hold += "time.sleep(90)"
    (tmp_path / "hold.py").write_text(hold)
    job_id, out, job = sbatch(
        tmp_path, "steps", "--nodes=2 --ntasks-per-node=1",
        ["srun", "--overlap", "-N1", "-n1", "-w", "h1", sys.executable, tmp_path / "hold.py", "&"],
        ["while [ ! -e", tmp_path / "held", "]; do sleep 0.2; done"],
        ["srun", "--overlap", "-N2", "-n2", "--mpi=pmix", *DLRM, "--rows", "1024", "--epochs", "1",
         "--checkpoint-dir", ckpt],
        ["echo second step exit $?; kill %1"], wait=True,
    )  # fmt: skip
    output = out.read_text()
    assert "second step exit 1" in output, output[-3000:]
    refusal = f"launch='slurm-step@{job_id}.0'"
    assert output.count(refusal) >= 1, output[-3000:]
    assert not (ckpt / "latest").exists()  # nothing of the refused save


@pytest.mark.full  # ~4 min: SLURM holds a requeued job 2 minutes
def test_a_requeued_job_resumes_from_its_last_commit(cluster, tmp_path):
    """`sbatch --requeue`: h2 dies mid-job, SLURM requeues the job; h2 boots again, and the
    job runs again on both nodes, resuming from the last commit."""
    ckpt, report = tmp_path / "ckpt", tmp_path / "report.json"
    train = [*DLRM, "--rows", "16000", "--epochs", "1", "--checkpoint-dir", ckpt]
    job_id, out, _ = sbatch(
        tmp_path, "requeue", "--nodes=2 --ntasks-per-node=1 --requeue "
        "--open-mode=append",
        ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", *train, "--checkpoint-every", "5",
         "--report", report],
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        while latest_step(ckpt) < 10:
            assert job_state(job_id) in ("PENDING", "RUNNING"), out.read_text()[-3000:]
            assert time.monotonic() - t0 < 240, "no second checkpoint in 240 s"
            time.sleep(0.5)
        netns("kill", "h2")
        while job_state(job_id) != "PENDING":  # requeued
            assert time.monotonic() - t0 < 300, out.read_text()[-3000:]
            time.sleep(0.5)
        assert slurm("revive", "h2", timeout=120).returncode == 0
        while not report.exists():
            assert time.monotonic() - t0 < 600, out.read_text()[-3000:]
            time.sleep(1)
        while job_state(job_id) != "COMPLETED":
            assert time.monotonic() - t0 < 660, out.read_text()[-3000:]
            time.sleep(1)
        output = out.read_text()
        assert output.count("2 ranks started by srun (rank 0 on h1, rank 1 on h2)") == 2
        assert "srun: error: Node failure on h2" in output
        assert f"Resumed from {ckpt}/ckpt-" in output
        assert json.loads(report.read_text())["world_size"] == 2
    finally:
        if "idle" not in slurm("run", "sinfo", "-h", "-N", "-n", "h2", "-o", "%T").stdout:
            assert netns("revive", "h2").returncode == 0
            assert slurm("start", "2", timeout=120).returncode == 0
