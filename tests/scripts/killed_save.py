"""Job for the killed-save test (run under horovodrun): saves the model (the old SavedModel,
copied aside for the test), trains on, and saves again into the same path; rank 0 is killed
(SIGKILL) as soon as the new SavedModel's variables are being written, as horovodrun kills it
when another rank dies mid-save.

Usage: horovodrun -np 2 python tests/scripts/killed_save.py SAVED_MODEL_PATH
"""

import os
import shutil
import signal
import sys
import threading
import time

sys.path.insert(0, os.getcwd())

from merlin_models_de import comm
from tests.ranks import oracle_dlrm as fc


def die_while_writing(path):
    """Kills this process once a new SavedModel beside ``path`` has variables on disk."""
    parent, name = os.path.split(os.path.abspath(path))

    def watch():
        while True:
            for entry in os.listdir(parent):
                variables = os.path.join(parent, entry, "variables")
                if (
                    entry.startswith(".tmp-")
                    and entry.endswith(f"-{name}")
                    and os.path.isdir(variables)
                    and os.listdir(variables)
                ):
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.001)

    threading.Thread(target=watch, daemon=True).start()


def main(path):
    spec = dict(optimizer="adagrad", lr=0.05, strategy="memory_balanced", column=None, small=True)
    data = comm.broadcast_object(fc.make_data(comm.size() * 8 * 4, seed=9))
    x, y = fc.split_xy(fc.only_columns(data, fc.small_schema().column_names), spec)
    rows = fc.rank_rows(len(y), 8, comm.size(), comm.rank())
    model = fc.build_model(spec)
    model.compile(optimizer=fc.optimizer("adagrad", 0.05))
    half = {k: v[rows[:16]] for k, v in x.items()}, y[rows[:16]]
    rest = {k: v[rows[16:]] for k, v in x.items()}, y[rows[16:]]
    model.fit(*half, batch_size=8, epochs=1, shuffle=False, verbose=0)
    model.save(path)  # every rank; rank 0 writes
    if comm.rank() == 0:
        shutil.copytree(path, f"{path}.old")
    model.fit(*rest, batch_size=8, epochs=1, shuffle=False, verbose=0)
    if comm.rank() == 0:
        die_while_writing(path)
    model.save(path)
    print("the second save finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
