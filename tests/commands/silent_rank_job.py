"""Job for test_silent_rank.py (run under horovodrun -np 2): a small Merlin model trains with
Keras ``fit``; rank 1 writes its pid to ``<directory>/stopped.pid`` and stops itself with
SIGSTOP at the end of batch 3, so rank 0 waits in the next step's first collective."""

import os
import signal
import sys

import tensorflow as tf

from merlin_models_de import comm
from tests.ranks import oracle_dlrm as fc


class StopRankOne(tf.keras.callbacks.Callback):
    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_train_batch_end(self, batch, logs=None):
        if comm.rank() == 1 and batch == 3:
            with open(os.path.join(self.directory, "stopped.pid"), "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)


def main(directory):
    spec = dict(small=True, strategy="basic", world_size=comm.size(), per_rank=8)
    data = fc.make_data(comm.size() * 8 * 10, seed=3)
    data = fc.only_columns(data, fc.small_schema().column_names)
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), 8, comm.size(), comm.rank())
    model = fc.build_model(spec)
    model.compile(optimizer=fc.optimizer("adagrad", 0.05))
    x = {k: v[rows] for k, v in x.items()}
    model.fit(x, y[rows], batch_size=8, verbose=0, callbacks=[StopRankOne(directory)])


if __name__ == "__main__":
    main(sys.argv[1])
