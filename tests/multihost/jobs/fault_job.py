"""Multi-host fault job: trains the fit oracle's DLRM for many short steps with a sharded
checkpoint every 2 steps (keep=1); rank 0 writes OUT/ready once step 6 is committed, so the
test can then kill a host or cut its link. It never finishes on its own (200 steps)."""

import os
import sys
import time

import numpy as np
import tensorflow as tf

from tests.multihost.jobs import watchdog


def main(out):
    watchdog.start()
    from merlin_models_de import comm
    from merlin_models_de.persistence.checkpoint import CheckpointCallback
    from tests.ranks import oracle_dlrm as fc

    model, x, y, rows = fc.fault_job_model(200, comm)

    class Pace(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            watchdog.progress()
            step = int(self.model.optimizer.iterations.numpy())
            if step == 7 and comm.rank() == 0:  # step 6's checkpoint is complete
                open(os.path.join(out, "ready"), "w").close()
            time.sleep(0.2)

    model.fit(
        {k: v[rows] for k, v in x.items()},
        y[rows],
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[
            CheckpointCallback(
                os.path.join(out, "ckpt"), every_n_steps=2, each_epoch=False, keep=1
            ),
            Pace(),
        ],
    )
    np.save(os.path.join(out, "finished.npy"), np.array([1]))


if __name__ == "__main__":
    main(sys.argv[1])
