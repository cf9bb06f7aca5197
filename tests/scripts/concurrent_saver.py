"""One of two jobs saving into the same checkpoint directory at once (test_persistence_lock).

Usage: python tests/scripts/concurrent_saver.py DIRECTORY GO_FILE OUT_JSON SEED
Builds the tiny test model, waits until GO_FILE exists (so both jobs start saving together),
then saves 15 times with keep=2, and writes to OUT_JSON, per save, "ok" or the error.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())

import tensorflow as tf

from merlin_models_de.persistence.checkpoint import save_checkpoint
from tests.unit import checkpoint_helpers as ch


def main(directory, go_file, out_json, seed):
    model = ch.build(lambda: tf.keras.optimizers.legacy.Adagrad(0.1), seed=int(seed))
    while not os.path.exists(go_file):
        time.sleep(0.01)
    results = []
    for step in range(15):
        try:
            save_checkpoint(model, directory, step=step, keep=2)
            results.append("ok")
        except Exception as exc:  # noqa: BLE001  (reported to the test)
            results.append(f"{type(exc).__name__}: {exc}")
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "results": results}, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
