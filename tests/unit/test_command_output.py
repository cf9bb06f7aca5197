"""What a command shows on a plain run (no --quiet, no logging variables set): one summary
line per epoch, no Keras epoch lines next to it, no slow-callback warning from our own
callbacks, no TensorFlow start-up log lines."""
import os
import subprocess
import sys

ENV = {k: v for k, v in os.environ.items()
       if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}


def test_dlrm_prints_one_line_per_epoch_and_no_noise():
    run = subprocess.run(
        [sys.executable, "-m", "merlin_models_de.apps.dlrm", "--rows", "2048", "--epochs", "2",
         "--max-table-rows", "1000", "--batch-size", "64", "--dim", "8", "--bottom-mlp", "16",
         "--top-mlp", "16"], capture_output=True, text=True, timeout=600, env=ENV, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summaries = [l for l in run.stdout.splitlines() if l.startswith("epoch ")]
    assert [l.split(":")[0] for l in summaries] == ["epoch 1", "epoch 2"], run.stdout
    assert "Epoch 1/2" not in run.stdout and "Epoch 2/2" not in run.stdout, run.stdout
    both = run.stdout + run.stderr
    assert "is slow compared to the batch time" not in both, both[-3000:]
    assert not [l for l in run.stderr.splitlines()
                if " I tensorflow/" in l or " W tensorflow/" in l], run.stderr[-3000:]
    assert "DistributedEmbeddings runs in one process (not started by horovodrun)" in run.stderr
