"""What a user's own 2-rank script prints with no logging settings: rank 0's progress and
the launch line, and none of the lines TensorFlow logs for the package's input pipelines."""

import os
import subprocess
import sys

import pytest

from tests.commands.launch import HOROVODRUN

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "user_ranking.py")
# the user's environment: nothing set to quiet TensorFlow or Python
ENV = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}


@pytest.mark.full  # ~35 s: a noise check; the CI tier's commands run the same input pipeline
def test_a_users_two_rank_script_prints_progress_without_tf_data_noise():
    run = subprocess.run(
        [HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface", "lo"]
        + [sys.executable, SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(ENV, CUDA_VISIBLE_DEVICES=""),
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    lines = out.splitlines()
    assert any(l.startswith("[0]<stdout>:") and "loss:" in l for l in lines), out[-3000:]
    assert not any(l.startswith("[1]<stdout>:") and "loss:" in l for l in lines)
    assert "merlin_models_de: 2 ranks started by horovodrun" in out
    assert sum("done" in l for l in lines) == 2
    # TF 2.12 logs this (and the node on the next line) per pipeline iterator it rewrites
    assert [l for l in lines if "Executor start aborting" in l] == []
