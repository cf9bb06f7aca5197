"""Table handles in one process behave like mm.Embeddings' EmbeddingTables."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.block.handles import TableAccessMixin, TableHandle
from merlin_models_de.block.layer import DistributedEmbeddings
from tests.ranks import oracle

Block = DistributedEmbeddings
assert issubclass(Block, TableAccessMixin)


def built():
    block = Block(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        sequence_combiner=oracle.COMBINERS,
        backend="horovod",
    )
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    arrays = oracle.global_tables(block.tables, seed=3)
    block.set_global_weights(arrays)
    return block, arrays


def test_handles_expose_merlin_table_attributes_and_lookups():
    block, arrays = built()
    user = block["user"]
    assert isinstance(user, TableHandle) and block["fav_genre"] is block["genre"]
    assert (user.input_dim, user.dim, user.name, user.col_schema.name) == (2000, 8, "user", "user")
    assert list(block["genre"].features) == ["genres", "fav_genre"]
    assert user.table.embeddings is user.embeddings
    np.testing.assert_array_equal(user.embeddings.numpy(), arrays["user"])
    ids = tf.constant([[1, 5], [7, 1999]])
    np.testing.assert_array_equal(user.embedding_lookup(ids).numpy(), arrays["user"][ids.numpy()])
    np.testing.assert_array_equal(user(tf.constant([[3], [4]])).numpy(), arrays["user"][[3, 4]])
    tags = tf.ragged.constant([[1, 2], [], [5]], tf.int64)
    np.testing.assert_allclose(
        block["tags"](tags).numpy(),
        np.stack([arrays["tags"][[1, 2]].mean(0), np.zeros(8), arrays["tags"][5]]),
        rtol=1e-6,
    )
    assert set(block.embedding_tables) == {t.name for t in block.tables}
    assert [h.name for h in block] == [t.name for t in block.tables]
    assert block.select_by_name("item") is block["item"]
    assert block.select_by_names(["item", "user"]) == [block["item"], block["user"]]
    with pytest.raises(KeyError, match="nope.*Tables"):
        block["nope"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside table 'user'"):
        user.embedding_lookup(tf.constant([2000]))


def test_handles_add_no_weights_and_the_table_trains_through_them():
    block, _ = built()
    before = len(block.weights)
    _ = block.embedding_tables, block["user"], list(block)
    assert len(block.weights) == before
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(block["user"].embedding_lookup(tf.constant([3, 3])))
    grad = tape.gradient(loss, block["user"].embeddings)
    np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy()[3], np.full(8, 2.0))


def test_select_by_tag_gives_a_view_of_the_matching_features():
    """As mm.Embeddings (a ParallelBlock of tables): the matching part, the block itself when
    every feature matches, None when none does; here a view that runs the whole block."""
    import merlin.models.tf as mm
    from merlin.schema import Schema, Tags

    from merlin_models_de.block.views import FeatureSelection
    from tests.schemas import cat

    schema = Schema(
        [
            cat("item_id", 99, tags=[Tags.ITEM, Tags.ID]),
            cat("item_category", 9, tags=[Tags.ITEM]),
            cat("user_id", 49, tags=[Tags.USER, Tags.ID]),
            cat("user_history", 99, multi_hot=True, tags=[Tags.USER]),
        ]
    )
    block = Block(schema, dim=4, backend="horovod")
    inputs = {
        "item_id": tf.constant([[3], [5]]),
        "item_category": tf.constant([[1], [2]]),
        "user_id": tf.constant([[7], [8]]),
        "user_history": tf.ragged.constant([[1, 2], [4]], tf.int64),
    }
    whole = block(inputs)
    items = block.select_by_tag(Tags.ITEM)
    assert isinstance(items, FeatureSelection)
    assert items.schema.column_names == ["item_id", "item_category"]
    got = items(inputs)
    assert sorted(got) == ["item_category", "item_id"]
    for name, value in got.items():
        np.testing.assert_array_equal(value.numpy(), whole[name].numpy())
    assert block.select_by_tag(Tags.CATEGORICAL) is block
    assert block.select_by_tag([Tags.SEQUENCE, Tags.TIME]) is None
    assert items.select_by_tag(Tags.ID).schema.column_names == ["item_id"]
    assert not items.trainable_weights or all(
        any(w is v for v in block.trainable_weights) for w in items.trainable_weights
    )
    # inside an input block, as a two-tower model selects its towers
    input_block = mm.InputBlockV2(schema, categorical=block, aggregation=None)
    user_inputs = input_block.select_by_tag(Tags.USER)
    assert sorted(user_inputs.schema.column_names) == ["user_history", "user_id"]
    got = user_inputs(inputs)
    np.testing.assert_allclose(got["user_history"].numpy(), whole["user_history"].numpy())
