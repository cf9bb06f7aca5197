"""model.save under horovodrun for schemas without an item-id column (scalars, fixed-length
and ragged lists, continuous features): the export loads in a plain process and predicts
what the distributed model predicts, and loads sharded under horovodrun too."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from tests.ranks.one_process import one_process_env

PER_RANK = 8

# the exported model predicts in a plain process (no Horovod) on every rank's rows
SINGLE_PROCESS_PREDICT = """
import sys
import numpy as np, tensorflow as tf
import merlin_models_de  # noqa: F401

data = dict(np.load(sys.argv[2]))
batch = {}
for key, value in data.items():
    if key.endswith("__lengths"):
        continue
    if key.endswith("__values"):
        name = key[:-len("__values")]
        batch[name] = tf.RaggedTensor.from_row_lengths(value, data[name + "__lengths"])
    else:
        batch[key] = tf.constant(value)
model = tf.keras.models.load_model(sys.argv[1])
np.save(sys.argv[3], model(batch, training=False).numpy())
"""


def lists_and_continuous():
    from merlin.schema import ColumnSchema, Schema, Tags

    def column(name, tags, dtype, domain, count=None, ragged=False):
        properties = {"domain": domain}
        if count is not None:
            properties["value_count"] = count
        return ColumnSchema(
            name,
            tags=tags,
            dtype=dtype,
            properties=properties,
            is_list=count is not None,
            is_ragged=ragged,
        )

    return Schema(
        [
            column("user", [Tags.CATEGORICAL, Tags.USER_ID], np.int64, {"min": 0, "max": 99}),
            column(
                "tags", [Tags.CATEGORICAL], np.int64, {"min": 0, "max": 49}, {"min": 3, "max": 3}
            ),
            column(
                "history",
                [Tags.CATEGORICAL],
                np.int64,
                {"min": 0, "max": 199},
                {"min": 1, "max": 5},
                ragged=True,
            ),
            column("price", [Tags.CONTINUOUS], np.float32, {"min": 0.0, "max": 10.0}),
            column(
                "click", [Tags.TARGET, Tags.BINARY_CLASSIFICATION], np.int64, {"min": 0, "max": 1}
            ),
        ]
    )


# (a Criteo schema without its item-id tag saved ~60 s of CI time for what test_fit.py's save
# test and this schema check: scalars, fixed and ragged lists, continuous, no item id)
SCHEMAS = {"lists-and-continuous": lists_and_continuous}


def make_data(schema, rows, seed):
    """{column: array} (ragged lists as ``__values`` / ``__lengths``), targets excluded."""
    from merlin.schema import Tags

    rng = np.random.default_rng(seed)
    out = {}
    for col in schema.excluding_by_tag(Tags.TARGET):
        if col.int_domain is None:
            out[col.name] = rng.uniform(0, 10, (rows, 1)).astype(np.float32)
            continue
        high = col.int_domain.max + 1
        if col.is_ragged:
            lengths = rng.integers(col.value_count.min, col.value_count.max + 1, rows)
            out[f"{col.name}__values"] = rng.integers(0, high, int(lengths.sum()))
            out[f"{col.name}__lengths"] = lengths
        else:
            width = col.value_count.max if col.is_list else 1
            out[col.name] = rng.integers(0, high, (rows, width))
    return out


def rank_batch(data, rows):
    """This rank's rows of ``data`` as model inputs."""
    batch = {}
    for key, value in data.items():
        if key.endswith("__lengths"):
            continue
        if key.endswith("__values"):
            name = key[: -len("__values")]
            ragged = tf.RaggedTensor.from_row_lengths(value, data[name + "__lengths"])
            batch[name] = tf.gather(ragged, rows)
        else:
            batch[key] = tf.constant(value[rows])
    return batch


def build(schema):
    import merlin.models.tf as mm

    tf.keras.utils.set_random_seed(1)
    return mm.DLRMModel(
        schema,
        embeddings=mm.DistributedEmbeddings(
            schema, dim=8, backend="horovod", strategy="memory_balanced"
        ),
        bottom_block=mm.MLPBlock([8]),
        top_block=mm.MLPBlock([8]),
        prediction_tasks=mm.BinaryClassificationTask(
            "click" if "click" in schema.column_names else "label"
        ),
    )


def predict_in_one_process(path, data, tmp):
    src, out = os.path.join(tmp, "data.npz"), os.path.join(tmp, "pred.npy")
    np.savez(src, **data)
    env = one_process_env()
    run = subprocess.run(
        [sys.executable, "-c", SINGLE_PROCESS_PREDICT, path, src, out],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return np.load(out) if run.returncode == 0 else run.stderr[-3000:]


@pytest.mark.full  # 2 ranks' export: also test_fit.py::test_save_exports_a_single_process_model
@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_export_without_item_id_loads_anywhere(hvd, tmp_path_factory, kind):
    from merlin.schema import Tags

    n, r = comm.size(), comm.rank()
    schema = SCHEMAS[kind]()
    assert not schema.select_by_tag(Tags.ITEM_ID).column_names
    data = make_data(schema, n * PER_RANK, seed=2)
    rows = np.arange(r * PER_RANK, (r + 1) * PER_RANK)
    model = build(schema)
    mine = model(rank_batch(data, rows), training=False).numpy()
    tmp = comm.broadcast_object(str(tmp_path_factory.mktemp("export")) if r == 0 else None)
    path = os.path.join(tmp, "model")
    model.save(path)  # every rank; rank 0 writes a single-process SavedModel

    distributed = np.concatenate(comm.allgather_object(mine))
    single = predict_in_one_process(path, data, tmp) if r == 0 else None
    single = comm.broadcast_object(single)
    assert not isinstance(single, str), single
    np.testing.assert_allclose(single, distributed, rtol=1e-5, atol=1e-6)

    loaded = tf.keras.models.load_model(path)  # and sharded again under horovodrun
    again = loaded(rank_batch(data, rows), training=False).numpy()
    problems = comm.allgather_object(
        None if np.allclose(again, mine, rtol=1e-5, atol=1e-6) else f"rank {r}: {again} != {mine}"
    )
    assert not [p for p in problems if p], problems
