"""Generator inputs and saved models without TensorFlow's "Executor start aborting" lines.

TensorFlow logs those lines (at INFO, which CI hides with TF_CPP_MIN_LOG_LEVEL=2) when shape
inference or tf.data's rewrites try to evaluate a placeholder: a user's 2-rank script showed
30 of them for one fit, evaluate and save (26 from the save). The script below runs with INFO logging on and
counts them per phase; a plain generator dataset is read first, so a TensorFlow that no
longer logs them at all fails the test instead of passing it for nothing.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINE = "Executor start aborting"

SCRIPT = r"""
import sys
import numpy as np
import tensorflow as tf
import merlin.models.tf as mm
import pandas as pd
from merlin.io import Dataset
from merlin.schema import ColumnSchema, Schema, Tags

import merlin_models_de  # noqa: F401
from merlin_models_de import loader_dataset
from merlin_models_de.compat.tf_data import generator_dataset, without_static_rewrites


def phase(name):
    print(f"@@ {name}", file=sys.stderr, flush=True)


def generator():
    for i in range(3):
        yield np.full([2], i, np.int64)


spec = tf.TensorSpec([None], tf.int64)
phase("plain generator")
assert [int(x[0]) for x in tf.data.Dataset.from_generator(generator, output_signature=spec)] == [0, 1, 2]
phase("generator without rewrites")
data = without_static_rewrites(tf.data.Dataset.from_generator(generator, output_signature=spec))
assert [int(x[0]) for x in data] == [0, 1, 2]
phase("generator dataset")
assert [int(x[0]) for x in generator_dataset(generator, spec)] == [0, 1, 2]
phase("loader_dataset")
frame = pd.DataFrame({"user": np.arange(12) % 5, "item": np.arange(12) % 7})
batches = list(loader_dataset(Dataset(frame, npartitions=2), 4))
assert [b["user"].numpy().tolist() for b in batches] == [[0, 1, 2, 3], [4, 0, 1, 2], [3, 4, 0, 1]]


def ids(name):
    domain = {"min": 0, "max": 99, "name": name}
    return ColumnSchema(name, dtype=np.int64, tags=[Tags.CATEGORICAL], properties={"domain": domain})


schema = Schema([ids("user"), ids("item"), ColumnSchema("click", dtype=np.float32, tags=[Tags.TARGET])])
model = mm.Model(
    mm.InputBlockV2(schema, categorical=mm.DistributedEmbeddings(schema, dim=8)),
    mm.MLPBlock([8]),
    mm.BinaryOutput("click"),
)
model({"user": tf.constant([[1], [2]], tf.int64), "item": tf.constant([[3], [4]], tf.int64)})
phase("save")
model.save(sys.argv[1])
phase("end")
"""


def phases(stderr: str) -> dict:
    """The log lines of each phase the script marked, by phase name."""
    counts, phase = {}, None
    for line in stderr.splitlines():
        if line.startswith("@@ "):
            phase = line[3:]
            counts[phase] = 0
        elif LINE in line and phase is not None:
            counts[phase] += 1
    return counts


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "model"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert (out / "saved_model.pb").exists()
    return phases(run.stderr)


def test_a_generator_read_without_rewrites_logs_nothing(logged):
    assert logged["plain generator"] >= 1  # TensorFlow still logs them: the check can fail
    assert logged["generator without rewrites"] == 0
    assert logged["generator dataset"] == 0


def test_loader_dataset_logs_nothing(logged):
    assert logged["loader_dataset"] == 0  # 1 before its generator went inside a flat_map


def test_saving_a_model_with_the_block_logs_nothing(logged):
    # 26 lines before the block's shapes were made static (the first saved-function
    # traces evaluate computed sizes of the id checks, the ids' unpacking and the rows')
    assert logged["save"] == 0
    assert logged["end"] == 0


def test_keras_sequence_input_is_read_without_rewrites_only_in_the_scope():
    import merlin.models.tf as mm  # noqa: F401  (installs the hooks)
    import tensorflow as tf
    from keras.engine import data_adapter

    from merlin_models_de.compat import merlin_hooks

    class Batches(tf.keras.utils.Sequence):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return tf.fill([4, 1], index)

    def rewrites(adapter):
        return adapter.get_dataset().options().experimental_optimization.apply_default_optimizations

    adapter = data_adapter.KerasSequenceAdapter(Batches())
    assert rewrites(adapter) is not False  # Keras' own outside the block's calls
    with merlin_hooks._across_ranks():
        assert rewrites(adapter) is False
        assert [int(b[0, 0]) for b in adapter.get_dataset()] == [0, 1]  # the same batches
