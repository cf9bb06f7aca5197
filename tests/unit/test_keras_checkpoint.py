"""The block in Keras checkpoints and SavedModels (persistence/keras_checkpoint.py): its
dependencies are named after tables, not after one rank's layout; tables load from
checkpoints written in the older layout form (whole tables) or fail naming what they cannot
take."""

import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings
from tests.schemas import cat


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
    with pytest.raises(
        ValueError, match=r"column slice of table 'user'.*Received: name='mp_user_c1'"
    ):
        tf.train.Checkpoint(block=block).read(str(tmp_path / "sliced"))


def test_checkpoints_name_tables_not_layouts(tmp_path):
    block = DistributedEmbeddings(Schema([cat("user", 9), cat("item", 4)]), dim=2)
    block.get_global_weights()  # built
    tf.train.Checkpoint(block=block).write(str(tmp_path / "ckpt"))
    names = {name for name, _ in tf.train.list_variables(str(tmp_path / "ckpt"))}
    assert {
        "block/table_user/.ATTRIBUTES/VARIABLE_VALUE",
        "block/table_item/.ATTRIBUTES/VARIABLE_VALUE",
    } <= names
    assert not [n for n in names if n.startswith(("block/mp_", "block/dp_", "block/rw_"))]
