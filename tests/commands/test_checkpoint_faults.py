"""A rank killed mid-epoch: horovodrun exits non-zero within a bounded time (no hang), the
last checkpoint (the only one, with keep=1) restores into a plain single process."""

import os
import subprocess
import sys
import time

import numpy as np

from merlin_models_de.persistence.checkpoint import latest_checkpoint, restore_checkpoint


def test_killed_rank_ends_the_job_and_the_last_checkpoint_restores(tmp_path):
    directory = str(tmp_path / "ckpt")
    os.makedirs(directory)
    start = time.time()
    run = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "horovodrun"),
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            sys.executable,
            "tests/scripts/fault_job.py",
            directory,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.getcwd(),
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    elapsed = time.time() - start
    assert run.returncode != 0, run.stdout[-2000:]
    assert elapsed < 300, f"horovodrun took {elapsed:.0f}s to notice the dead rank"
    assert not os.path.exists(os.path.join(directory, "finished.npy"))
    # steps 2 and 4 were checkpointed before rank 1 died at step 5; keep=1 removed step 2
    assert latest_checkpoint(directory).endswith("ckpt-000000004")
    assert sorted(os.listdir(directory)) == ["ckpt-000000004", "latest"]

    from tests.ranks import oracle_dlrm as fc

    spec = dict(
        optimizer="adagrad", lr=0.05, strategy="basic", column=None, world_size=1, per_rank=8
    )
    data = fc.make_data(16, seed=1)
    x, y = fc.split_xy(data, spec)
    model = fc.build_model(spec)
    model(fc.take(x, 0, 2))
    model.compile(optimizer=fc.optimizer("adagrad", 0.05))
    assert restore_checkpoint(model, directory)["step"] == 4
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
