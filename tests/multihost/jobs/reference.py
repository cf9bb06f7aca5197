"""The fit job's one-process oracle (tests/ranks/fit_reference) on fresh data, and the
comparison of a job's weights with it: shared by every launcher's fit test (ssh hosts,
mpirun, SLURM)."""

import json
import subprocess
import sys

import numpy as np


def fit_spec(ranks, per_rank):
    """The fit job's model and training: Adagrad, memory_balanced with column slices."""
    return dict(
        optimizer="adagrad",
        lr=0.05,
        strategy="memory_balanced",
        column=4000,
        world_size=ranks,
        per_rank=per_rank,
    )


def one_process(tmp, spec, per_rank, steps):
    """Writes the job's input (``in.npz``) and the oracle's weights (``ref.npz``) in ``tmp``;
    returns (input path, reference path, reference)."""
    from tests.ranks import oracle_dlrm as fc

    src, ref = str(tmp / "in.npz"), str(tmp / "ref.npz")
    np.savez(src, spec=json.dumps(spec), **fc.make_data(spec["world_size"] * per_rank * steps, 5))
    run = subprocess.run(
        [sys.executable, "-m", "tests.ranks.fit_reference", src, ref],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return src, ref, dict(np.load(ref, allow_pickle=True))


def assert_same_weights(got, want, prefix=""):
    """Every dense weight and table of ``got`` equals ``want``'s (under ``prefix``), and both
    hold the same ones."""
    keys = [k for k in got if k.startswith(("dense/", "table/"))]
    assert keys and len(keys) == len(
        [k for k in want if k.startswith(prefix + "dense/") or k.startswith(prefix + "table/")]
    )
    for key in keys:
        np.testing.assert_allclose(got[key], want[prefix + key], rtol=1e-4, atol=1e-5, err_msg=key)
