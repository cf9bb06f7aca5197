"""What export and reload rest on, in one process: the sample batch that builds the exported
copy follows any schema the block accepts, and the block's tables load from checkpoints
written in the older layout form (whole tables) or fail naming what they cannot take."""
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

import merlin.models.tf as mm

from merlin_models_de import DistributedEmbeddings
from merlin_models_de.persistence.export import sample_batch
from tests.unit.helpers import cat, synthetic


def lists_schema():
    return Schema([
        cat("user", 9),
        ColumnSchema("tags", tags=[Tags.CATEGORICAL], dtype=np.int64, is_list=True,
                     is_ragged=False, properties={"domain": {"min": 2, "max": 6},
                                                  "value_count": {"min": 3, "max": 3}}),
        ColumnSchema("history", tags=[Tags.CATEGORICAL], dtype=np.int32, is_list=True,
                     is_ragged=True, properties={"domain": {"min": 0, "max": 99},
                                                 "value_count": {"min": 1, "max": 4}}),
        ColumnSchema("price", tags=[Tags.CONTINUOUS], dtype=np.float32,
                     properties={"domain": {"min": 1.0, "max": 3.0}}),
        ColumnSchema("click", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION], dtype=np.int64,
                     properties={"domain": {"min": 0, "max": 1}}),
    ])


def test_sample_batch_follows_the_schema():
    batch = sample_batch(lists_schema(), rows=5)
    # the Loader's form (the target is no input): ragged lists as values and offsets
    assert sorted(batch) == ["history__offsets", "history__values", "price", "tags", "user"]
    assert batch["user"].shape == (5,) and batch["user"].dtype == tf.int64
    assert batch["tags"].shape == (5, 3)  # fixed-length lists come dense, as the Loader's
    assert set(batch["tags"].numpy().ravel()) <= set(range(2, 7))
    history = tf.RaggedTensor.from_row_splits(batch["history__values"],
                                              batch["history__offsets"])
    assert history.dtype == tf.int32
    assert set(history.row_lengths().numpy()) <= {1, 2, 3, 4}
    assert batch["price"].dtype == tf.float32 and np.all(batch["price"].numpy() == 2.0)


@pytest.mark.parametrize("kind", ["criteo-without-item-id", "lists"])
def test_sample_batch_builds_models_of_schemas_without_item_id(kind):
    if kind == "lists":
        schema = lists_schema()
    else:
        schema = Schema([ColumnSchema(c.name, tags=[t for t in c.tags
                                                    if t not in (Tags.ITEM_ID, Tags.ITEM, Tags.ID)],
                                      dtype=c.dtype, properties=c.properties)
                         for c in synthetic("criteo", 8).schema])
    assert not schema.select_by_tag(Tags.ITEM_ID).column_names
    model = mm.DLRMModel(schema, embeddings=DistributedEmbeddings(schema, dim=4),
                         bottom_block=mm.MLPBlock([4]), top_block=mm.MLPBlock([4]),
                         prediction_tasks=mm.BinaryClassificationTask(
                             schema.select_by_tag(Tags.TARGET).column_names[0]))
    out = model(sample_batch(schema, rows=3), training=False)
    assert out.shape == (3, 1) and np.all(np.isfinite(out.numpy()))


def test_tables_load_from_older_layout_names_or_fail_naming_them(tmp_path):
    block = DistributedEmbeddings(Schema([cat("user", 9), cat("item", 4)]), dim=2)
    old = tf.Module()  # what an older export held: whole tables named after the layout
    old.mp_user = tf.Variable(np.arange(20, dtype=np.float32).reshape(10, 2))
    old.dp_item = tf.Variable(np.ones((5, 2), np.float32))
    tf.train.Checkpoint(block=old).write(str(tmp_path / "old"))
    tf.train.Checkpoint(block=block).read(str(tmp_path / "old")).assert_existing_objects_matched()
    tables = block.get_global_weights()
    np.testing.assert_array_equal(tables["user"], old.mp_user.numpy())
    np.testing.assert_array_equal(tables["item"], old.dp_item.numpy())

    sliced = tf.Module()
    sliced.mp_user_c1 = tf.Variable(np.zeros((10, 1), np.float32))
    tf.train.Checkpoint(block=sliced).write(str(tmp_path / "sliced"))
    with pytest.raises(ValueError, match=r"column slice of table 'user'.*Received: "
                                         r"name='mp_user_c1'"):
        tf.train.Checkpoint(block=block).read(str(tmp_path / "sliced"))


def test_checkpoints_name_tables_not_layouts(tmp_path):
    block = DistributedEmbeddings(Schema([cat("user", 9), cat("item", 4)]), dim=2)
    block.get_global_weights()  # built
    tf.train.Checkpoint(block=block).write(str(tmp_path / "ckpt"))
    names = {name for name, _ in tf.train.list_variables(str(tmp_path / "ckpt"))}
    assert {"block/table_user/.ATTRIBUTES/VARIABLE_VALUE",
            "block/table_item/.ATTRIBUTES/VARIABLE_VALUE"} <= names
    assert not [n for n in names if n.startswith(("block/mp_", "block/dp_", "block/rw_"))]


@pytest.mark.full  # the export from 2 ranks: horovod/test_fit.py::test_save_exports...
def test_the_exported_copy_reloads_as_the_model_and_leaves_names_alone(tmp_path):
    """The export's single-process copy (rebuilt from the config) saves a config that loads
    back as the same model (Merlin's SequentialBlock used to hand the DLRM's interaction the
    input schema: the loaded model dropped its bottom MLP), and building it moves no Keras
    name counter (rank 0 alone builds it; names must stay equal across ranks)."""
    from keras import backend

    from merlin_models_de.persistence.export import save_single_process

    schema = lists_schema()  # a ragged list, a fixed-length list, scalars
    model = mm.DLRMModel(schema, embeddings=DistributedEmbeddings(schema, dim=4),
                         bottom_block=mm.MLPBlock([4]), top_block=mm.MLPBlock([4]),
                         prediction_tasks=mm.BinaryClassificationTask("click"))
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
