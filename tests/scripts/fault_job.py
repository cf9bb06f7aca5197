"""Job for the fault test (run under horovodrun): trains with checkpoints every 2 steps,
keeping the newest one only; rank 1 kills itself with SIGKILL at step 5, mid-epoch."""

import os
import signal
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.getcwd())

from merlin_models_de import comm
from merlin_models_de.persistence.checkpoint import CheckpointCallback
from tests.ranks import oracle_dlrm as fc


class Die(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if comm.rank() == 1 and int(self.model.optimizer.iterations.numpy()) == 5:
            os.kill(os.getpid(), signal.SIGKILL)


def main(directory):
    model, x, y, rows = fc.fault_job_model(10, comm)
    model.fit(
        {k: v[rows] for k, v in x.items()},
        y[rows],
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[CheckpointCallback(directory, every_n_steps=2, each_epoch=False, keep=1), Die()],
    )
    np.save(os.path.join(directory, "finished.npy"), np.array([1]))


if __name__ == "__main__":
    main(sys.argv[1])
