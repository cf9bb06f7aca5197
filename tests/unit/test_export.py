"""The single-process export (persistence/export.py), in one process: the sample batch that
builds the exported copy follows any schema the block accepts, and the exported copy reloads
as the model; a save killed while rank 0 writes leaves the old SavedModel whole."""

import os
import subprocess
import sys

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de import DistributedEmbeddings
from merlin_models_de.persistence.export import sample_batch
from tests.schemas import cat, synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lists_schema():
    return Schema(
        [
            cat("user", 9),
            ColumnSchema(
                "tags",
                tags=[Tags.CATEGORICAL],
                dtype=np.int64,
                is_list=True,
                is_ragged=False,
                properties={"domain": {"min": 2, "max": 6}, "value_count": {"min": 3, "max": 3}},
            ),
            ColumnSchema(
                "history",
                tags=[Tags.CATEGORICAL],
                dtype=np.int32,
                is_list=True,
                is_ragged=True,
                properties={"domain": {"min": 0, "max": 99}, "value_count": {"min": 1, "max": 4}},
            ),
            ColumnSchema(
                "price",
                tags=[Tags.CONTINUOUS],
                dtype=np.float32,
                properties={"domain": {"min": 1.0, "max": 3.0}},
            ),
            ColumnSchema(
                "click",
                tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION],
                dtype=np.int64,
                properties={"domain": {"min": 0, "max": 1}},
            ),
        ]
    )


def test_sample_batch_follows_the_schema():
    batch = sample_batch(lists_schema(), rows=5)
    # the Loader's form (the target is no input): ragged lists as values and offsets
    assert sorted(batch) == ["history__offsets", "history__values", "price", "tags", "user"]
    assert batch["user"].shape == (5,) and batch["user"].dtype == tf.int64
    assert batch["tags"].shape == (5, 3)  # fixed-length lists come dense, as the Loader's
    assert set(batch["tags"].numpy().ravel()) <= set(range(2, 7))
    history = tf.RaggedTensor.from_row_splits(batch["history__values"], batch["history__offsets"])
    assert history.dtype == tf.int32
    assert set(history.row_lengths().numpy()) <= {1, 2, 3, 4}
    assert batch["price"].dtype == tf.float32 and np.all(batch["price"].numpy() == 2.0)


@pytest.mark.parametrize("kind", ["criteo-without-item-id", "lists"])
def test_sample_batch_builds_models_of_schemas_without_item_id(kind):
    if kind == "lists":
        schema = lists_schema()
    else:
        schema = Schema(
            [
                ColumnSchema(
                    c.name,
                    tags=[t for t in c.tags if t not in (Tags.ITEM_ID, Tags.ITEM, Tags.ID)],
                    dtype=c.dtype,
                    properties=c.properties,
                )
                for c in synthetic("criteo", 8).schema
            ]
        )
    assert not schema.select_by_tag(Tags.ITEM_ID).column_names
    model = mm.DLRMModel(
        schema,
        embeddings=DistributedEmbeddings(schema, dim=4),
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryClassificationTask(
            schema.select_by_tag(Tags.TARGET).column_names[0]
        ),
    )
    out = model(sample_batch(schema, rows=3), training=False)
    assert out.shape == (3, 1) and np.all(np.isfinite(out.numpy()))


@pytest.mark.full  # the export from 2 ranks: horovod/test_fit.py::test_save_exports...
def test_the_exported_copy_reloads_as_the_model_and_leaves_names_alone(tmp_path):
    """The export's single-process copy (rebuilt from the config) saves a config that loads
    back as the same model (Merlin's SequentialBlock used to hand the DLRM's interaction the
    input schema: the loaded model dropped its bottom MLP), and building it moves no Keras
    name counter (rank 0 alone builds it; names must stay equal across ranks)."""
    from keras import backend

    from merlin_models_de.persistence.export import save_single_process

    schema = lists_schema()  # a ragged list, a fixed-length list, scalars
    model = mm.DLRMModel(
        schema,
        embeddings=DistributedEmbeddings(schema, dim=4),
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryClassificationTask("click"),
    )
    batch = sample_batch(schema, rows=4)
    want = model(batch, training=False).numpy()
    counters = dict(backend.get_default_graph_uid_map())
    save_single_process(model, lambda m, path: m.save(path), str(tmp_path / "saved"))
    assert dict(backend.get_default_graph_uid_map()) == counters

    # the serving signature takes the Loader's column names (what Merlin Systems feeds)
    signature = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == sorted(batch)

    loaded = tf.keras.models.load_model(str(tmp_path / "saved"))
    assert type(loaded.layers[0]).__name__ == "SequentialBlock"  # rebuilt from its config
    np.testing.assert_allclose(loaded(batch, training=False).numpy(), want, rtol=1e-6)


def files_of(root):
    """{relative path: bytes} of every file below ``root``."""
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                out[os.path.relpath(os.path.join(directory, name), root)] = f.read()
    return out


@pytest.mark.full  # 69 s; CI kills a rank mid-checkpoint in tests/commands/test_checkpoint_faults.py
def test_a_save_killed_while_rank_0_writes_leaves_the_old_savedmodel_whole(tmp_path):
    """model.save under horovodrun, killed while rank 0 writes the new SavedModel over an
    old one: the old one stays byte for byte (its variables were once overwritten under the
    old graph), loads, and the killed save's temporary is left beside it."""
    path = str(tmp_path / "saved")
    run = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "horovodrun"),
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            sys.executable,
            "tests/scripts/killed_save.py",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert run.returncode != 0 and "the second save finished" not in run.stdout, (
        run.stdout[-2000:] + run.stderr[-2000:]
    )
    assert os.path.isdir(f"{path}.old"), run.stdout[-2000:] + run.stderr[-2000:]
    old = files_of(f"{path}.old")
    assert "saved_model.pb" in old and files_of(path) == old
    left = [n for n in os.listdir(tmp_path) if n not in ("saved", "saved.old")]
    assert len(left) == 1 and left[0].startswith(".tmp-") and left[0].endswith("-saved"), left
    from merlin_models_de.variables import embedding_blocks

    assert embedding_blocks(tf.keras.models.load_model(path))  # in one process
