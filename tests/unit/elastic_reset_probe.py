"""Run by tests/unit/test_elastic_memory.py in a process of its own: one rank's elastic reset
of a model with 4 tables of 250,000 x 64 (256 MB, and as much again in Adagrad's slots),
restored from its last commit. Prints JSON: the model's bytes (tables and slots), the resident
size before the reset (the old model alive) and the peak during it (the kernel's VmHWM, reset
just before).

Usage: python -m tests.unit.elastic_reset_probe CHECKPOINT_DIR
"""

import json
import sys

import numpy as np
import tensorflow as tf

ROWS, DIM, TABLES = 250_000, 64, 4


def status(key: str) -> int:
    line = next(line for line in open("/proc/self/status") if line.startswith(key))
    return int(line.split()[1]) * 1024


def batch():
    return {f"c{i}": tf.constant(np.arange(8) * 1000 + i) for i in range(TABLES)}


def build():
    import merlin.models.tf as mm
    from merlin.schema import Schema, Tags

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)
    from tests.schemas import cat

    schema = Schema([cat(f"c{i}", ROWS - 1) for i in range(TABLES)])
    schema += Schema([cat("label", 1, tags=[Tags.BINARY_CLASSIFICATION, Tags.TARGET])])
    inputs = schema.select_by_tag(Tags.CATEGORICAL).remove_by_tag(Tags.TARGET)
    model = mm.Model(
        mm.InputBlockV2(inputs, categorical=mm.DistributedEmbeddings(inputs, dim=DIM)),
        mm.MLPBlock([4]),
        mm.BinaryOutput("label"),
    )
    model(batch())
    model.compile(optimizer="adagrad")
    return model


def table_bytes(model) -> int:
    """The bytes of the tables and their slots (no reference to them is kept)."""
    tables = [v for v in model.variables if v.shape[:1] == [ROWS]]
    slots = [v for v in model.optimizer.variables() if v.shape[:1] == [ROWS]]
    return sum(int(np.prod(v.shape)) * v.dtype.size for v in tables + slots)


def main(directory: str) -> None:
    import horovod.tensorflow as hvd

    from merlin_models_de.elastic.state import ShardedState

    hvd.init()
    state = ShardedState(build, directory, commit_every=1)
    state.sync()  # the first start: builds, commits, restores
    state.model.train_on_batch(batch(), tf.zeros([8, 1]))  # Adagrad's slots exist now
    state.commit()
    model_bytes = table_bytes(state.model)
    before = status("VmRSS:")
    open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
    state.reset()
    peak = status("VmHWM:")
    state.model.train_on_batch(batch(), tf.zeros([8, 1]))  # the rebuilt model trains
    print(json.dumps({"model": model_bytes, "before": before, "peak": peak}))


if __name__ == "__main__":
    main(sys.argv[1])
