"""mm.Embeddings' other arguments in one process: the block equals mm.Embeddings for each
(losses, trainable tables, Keras-layer combiners, column selection, output shapes)."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de import DistributedEmbeddings
from tests.schemas import cat


def schema():
    return Schema(
        [
            cat("user", 19),
            cat("item", 29),
            cat("tags", 9, domain_name="tag", multi_hot=True),
            cat("liked", 9, domain_name="tag", multi_hot=True),
        ]
    )


def batch():
    return {
        "user": tf.constant([[1], [2], [3], [19]]),
        "item": tf.constant([[0], [5], [29], [7]]),
        "tags": tf.ragged.constant([[1, 2, 3], [4], [5, 6], [0, 9]], dtype=tf.int64)[..., None],
        "liked": tf.ragged.constant([[1], [2, 2], [8, 9, 0], [3]], dtype=tf.int64)[..., None],
    }


def pair(**kwargs):
    """mm.Embeddings and the block on the same schema and arguments, with the same tables."""
    tf.keras.utils.set_random_seed(3)
    reference = mm.Embeddings(schema(), dim=4, **kwargs)
    want = reference(batch())
    block = DistributedEmbeddings(schema(), dim=4, **kwargs)
    block(batch())
    block.set_global_weights(
        {name: layer.table.embeddings.numpy() for name, layer in reference.parallel_dict.items()}
    )
    got = block(batch())
    return reference, want, block, got


def assert_outputs_equal(got, want):
    assert sorted(got) == sorted(want)
    for key in want:
        assert type(got[key]) is type(want[key]), key
        g, w = got[key], want[key]
        if isinstance(w, tf.RaggedTensor):
            np.testing.assert_array_equal(g.row_splits, w.row_splits)
            g, w = g.flat_values, w.flat_values
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6, err_msg=key)


def total(losses):
    return float(tf.add_n(losses)) if losses else 0.0


@pytest.mark.parametrize("factor", [0.01, {"user": 0.5, "tags": 0.25}, {"tag": 0.1}])
@pytest.mark.parametrize("combiner", ["mean", None])
def test_l2_batch_regularization_factor_equals_mm_embeddings(factor, combiner):
    if factor == {"tag": 0.1}:  # mm.Embeddings reads feature names only: the same value by name
        ref_factor = {"tags": 0.1}
        reference, want, _, _ = pair(
            l2_batch_regularization_factor=ref_factor, sequence_combiner=combiner
        )
        _, _, block, got = pair(l2_batch_regularization_factor=factor, sequence_combiner=combiner)
    else:
        reference, want, block, got = pair(
            l2_batch_regularization_factor=factor, sequence_combiner=combiner
        )
    assert_outputs_equal(got, want)
    assert total(reference.losses) > 0
    np.testing.assert_allclose(total(block.losses), total(reference.losses), rtol=1e-6)


@pytest.mark.parametrize(
    "regularizer",
    [
        "l2",
        tf.keras.regularizers.L1L2(0.01, 0.02),
        {"item": "l1", "tags": tf.keras.regularizers.L2(0.3)},
        tf.keras.regularizers.OrthogonalRegularizer(0.1),
    ],
)
def test_embeddings_regularizer_equals_mm_embeddings(regularizer):
    reference, want, block, got = pair(embeddings_regularizer=regularizer)
    assert_outputs_equal(got, want)
    assert total(reference.losses) > 0
    np.testing.assert_allclose(total(block.losses), total(reference.losses), rtol=1e-5)


def trainable_tables(variables):
    return sorted(
        {
            v.name.split("/")[-1].split(":")[0].split("_", 1)[1]
            for v in variables
            if not v.name.split("/")[-1].startswith("exchange_anchor")
        }
    )


@pytest.mark.parametrize("trainable", [{"user": False, "tags": False}, {"item": True}, False])
def test_trainable_dict_freezes_the_same_tables_as_mm_embeddings(trainable):
    reference, _, block, _ = pair(trainable=trainable)
    want = sorted(
        name
        for name, layer in reference.parallel_dict.items()
        if layer.trainable and layer.table.trainable
    )
    if trainable is False:
        want = []  # mm.Embeddings forwards only a truthy `trainable`; the block freezes all
    assert trainable_tables(block.trainable_weights) == want
    opt = tf.keras.optimizers.SGD(1.0)
    before = block.get_global_weights()
    with tf.GradientTape() as tape:
        loss = sum(
            tf.reduce_sum(v) if isinstance(v, tf.Tensor) else tf.reduce_sum(v.flat_values)
            for v in block(batch()).values()
        )
    opt.apply_gradients(zip(tape.gradient(loss, block.trainable_weights), block.trainable_weights))
    after = block.get_global_weights()
    for name in before:
        changed = not np.array_equal(before[name], after[name])
        assert changed == (name in want), name


def test_trainable_dict_names_a_bad_value():
    with pytest.raises(
        ValueError, match=r"trainable for table 'user' must be a bool. Received: 'no'"
    ):
        DistributedEmbeddings(schema(), dim=4, trainable={"user": "no"})
    with pytest.raises(
        ValueError,
        match=r"trainable names features or tables that are not in the schema: \['nope'\]",
    ):
        DistributedEmbeddings(schema(), dim=4, trainable={"nope": False})


def mean_layer():
    return tf.keras.layers.Lambda(lambda x: tf.reduce_mean(x, axis=1))


@pytest.mark.parametrize(
    "make",
    [mean_layer, lambda: {"tags": mean_layer(), "liked": "sum"}, lambda: {"tags": mean_layer()}],
)
def test_keras_layer_combiner_equals_mm_embeddings_and_round_trips(make):
    combiner = make()
    reference, want, block, got = pair(sequence_combiner=combiner)
    assert_outputs_equal(got, want)
    config = block.get_config()
    again = DistributedEmbeddings.from_config(config)
    again(batch())
    again.set_global_weights(block.get_global_weights())
    assert_outputs_equal(again(batch()), want)


def test_wide_and_deep_default_combiner_trains():
    """WideAndDeepModel's deep branch passes a Lambda combiner to mm.Embeddings; Keras fit
    takes dense inputs, so the list is fixed-length [B, 3] here."""
    fixed = ColumnSchema(
        "tags",
        tags=[Tags.CATEGORICAL],
        dtype=np.int64,
        is_list=True,
        properties={"domain": {"min": 0, "max": 9}, "value_count": {"min": 3, "max": 3}},
    )
    label = ColumnSchema(
        "click",
        tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION],
        dtype=np.int64,
        properties={"domain": {"min": 0, "max": 1}},
    )
    s = Schema([cat("user", 19), fixed, label])
    block = DistributedEmbeddings(s, dim=4, sequence_combiner=mean_layer())
    model = mm.Model(
        mm.InputBlockV2(s, categorical=block),
        mm.MLPBlock([4]),
        mm.BinaryClassificationTask("click"),
    )
    model.compile(optimizer="sgd")
    x = {
        "user": tf.constant([1, 2, 3, 4]),
        "tags": tf.constant([[1, 2, 3], [4, 5, 6], [0, 0, 1], [9, 8, 7]]),
    }
    history = model.fit(x, tf.constant([0, 1, 1, 0]), batch_size=4, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def test_schema_without_categorical_tags_embeds_every_column_like_mm_embeddings():
    untagged = Schema(
        [
            ColumnSchema(
                c.name,
                dtype=c.dtype,
                properties=c.properties,
                is_list=c.is_list,
                is_ragged=c.is_ragged,
            )
            for c in schema()
        ]
    )
    reference = mm.Embeddings(untagged, dim=4)
    block = DistributedEmbeddings(untagged, dim=4)
    assert sorted(t.name for t in block.tables) == sorted(reference.parallel_dict)
    assert sorted(block(batch())) == sorted(reference(batch()))


def test_column_without_a_domain_is_named():
    bad = Schema(
        [
            ColumnSchema("user", dtype=np.int64, properties={"domain": {"min": 0, "max": 9}}),
            ColumnSchema("score", dtype=np.float32),
        ]
    )
    with pytest.raises(
        ValueError, match=r"Column 'score' has no cardinality, so it cannot be embedded"
    ):
        DistributedEmbeddings(bad, dim=4)


def test_full_schema_embeds_what_merlin_models_embed(synthetic_schema):
    full = synthetic_schema("aliccp-raw")
    block = DistributedEmbeddings(full, dim=4)
    cats = full.select_by_tag(Tags.CATEGORICAL).excluding_by_tag(Tags.TARGET)
    assert sorted(f.name for f in block.features) == sorted(cats.column_names)


def test_compute_output_shape_is_3d_for_unpooled_features():
    s = Schema([cat("user", 9), cat("tags", 9, multi_hot=True), cat("fixed", 9, multi_hot=True)])
    block = DistributedEmbeddings(s, dim=4, sequence_combiner=None)
    shapes = block.compute_output_shape(
        {
            "user": tf.TensorShape([8, 1]),
            "tags": tf.TensorShape([8, None]),
            "fixed": tf.TensorShape([8, 3, 1]),
        }
    )
    assert shapes == {
        "user": tf.TensorShape([8, 4]),
        "tags": tf.TensorShape([8, None, 4]),
        "fixed": tf.TensorShape([8, 3, 4]),
    }
    pooled = DistributedEmbeddings(
        s, dim=4, sequence_combiner={"tags": mean_layer(), "fixed": "sum"}
    )
    shapes = pooled.compute_output_shape(
        {
            "user": tf.TensorShape([8]),
            "tags": tf.TensorShape([8, None]),
            "fixed": tf.TensorShape([8, 3]),
        }
    )
    assert all(v == tf.TensorShape([8, 4]) for v in shapes.values())


def test_block_name_and_unsupported_arguments():
    assert DistributedEmbeddings(schema(), dim=4, block_name="emb").name == "emb"
    assert DistributedEmbeddings(schema(), dim=4, table_cls=mm.EmbeddingTable, mask_zero=False)
    for key, value in [
        ("activity_regularizer", "l2"),
        ("pre", mm.Filter(["user"])),
        ("post", "l2-norm"),
        ("aggregation", "concat"),
        ("table_cls", tf.keras.layers.Embedding),
        ("embeddings_constraint", "non_neg"),
        ("mask_zero", True),
    ]:
        with pytest.raises(
            NotImplementedError, match=rf"does not support {key} .*Received: {key}="
        ):
            DistributedEmbeddings(schema(), dim=4, **{key: value})


@pytest.mark.parametrize(
    "initializer",
    [
        tf.keras.initializers.RandomUniform(-0.1, 0.1),
        {"a": tf.keras.initializers.Constant(0.5), "b": "zeros"},
    ],
    ids=["one", "by_table"],
)
def test_an_initializer_object_survives_two_config_round_trips(initializer):
    """from_config gets the serialized initializer; saving that copy again (an exported or
    reloaded model saved once more) keeps it, and it initializes the same tables."""
    schema = Schema([cat("a", 9), cat("b", 9)])
    block = DistributedEmbeddings(schema, dim=3, embeddings_initializer=initializer)
    again = DistributedEmbeddings.from_config(
        DistributedEmbeddings.from_config(block.get_config()).get_config()
    )
    assert (
        again.get_config()["embeddings_initializer"] == block.get_config()["embeddings_initializer"]
    )
    for b in (block, again):
        b.ensure_built()
    for name, table in again.get_global_weights().items():
        if name == "a" and isinstance(initializer, dict):
            np.testing.assert_array_equal(table, np.full((10, 3), 0.5, np.float32))
        elif isinstance(initializer, dict):
            np.testing.assert_array_equal(table, np.zeros((10, 3), np.float32))
        else:
            assert np.abs(table).max() <= 0.1 and np.abs(table).max() > 0
