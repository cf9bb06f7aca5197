"""The block in one process: same outputs as mm.Embeddings, config, save / load, errors."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.models.tf.transforms.features import PrepareFeatures
from merlin.schema import Schema, Tags

import merlin_models_de
from merlin_models_de import DistributedEmbeddings
from tests.schemas import cat, synthetic
from tests.tf_inspection import TFLogRecords


def first_batch(name, schema_fn, rows=64, batch=32):
    from merlin.datasets.synthetic import generate_data

    ds = generate_data(name, rows)
    x, _ = next(iter(mm.Loader(ds, batch_size=batch)))
    return ds.schema, PrepareFeatures(ds.schema)(x)


def copy_tables(reference, block):
    """Sets ``block``'s tables from an mm.Embeddings block's tables."""
    arrays = {
        name: layer.table.embeddings.numpy() for name, layer in reference.parallel_dict.items()
    }
    block.set_global_weights(arrays)
    return arrays


@pytest.mark.parametrize(
    "dataset",
    [
        pytest.param("criteo", marks=pytest.mark.full),
        "aliccp-raw",
        "music-streaming",
        "sequence-testing",
    ],
)
def test_outputs_equal_mm_embeddings(dataset, synthetic_schema):
    schema, features = first_batch(dataset, synthetic_schema)
    cats = schema.select_by_tag(Tags.CATEGORICAL).excluding_by_tag(Tags.TARGET)
    reference = mm.Embeddings(cats, dim=8)
    want = reference(features)
    block = DistributedEmbeddings(schema, dim=8)
    block(features)
    copy_tables(reference, block)
    got = block(features)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype, key
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dataset", ["sequence-testing", "music-streaming"])
def test_unpooled_sequences_equal_mm_embeddings(dataset, synthetic_schema):
    """sequence_combiner=None: the same ragged [B, None, dim] (same row splits) as Merlin."""
    schema, features = first_batch(dataset, synthetic_schema)
    cats = schema.select_by_tag(Tags.CATEGORICAL).excluding_by_tag(Tags.TARGET)
    reference = mm.Embeddings(cats, dim=8, sequence_combiner=None)
    want = reference(features)
    block = DistributedEmbeddings(schema, dim=8, sequence_combiner=None)
    block(features)
    copy_tables(reference, block)
    got = block(features)
    ragged = [k for k, v in want.items() if isinstance(v, tf.RaggedTensor)]
    assert ragged, "the dataset has list features"
    for key in want:
        assert type(got[key]) is type(want[key]), key
        if key in ragged:
            assert got[key].row_splits.dtype == want[key].row_splits.dtype
            np.testing.assert_array_equal(got[key].row_splits, want[key].row_splits)
            got_v, want_v = got[key].flat_values, want[key].flat_values
        else:
            got_v, want_v = got[key], want[key]
        np.testing.assert_allclose(got_v.numpy(), want_v.numpy(), rtol=1e-6, atol=1e-6)


def test_fixed_length_lists_come_back_dense():
    schema = Schema([cat("user", 9), cat("tags", 4, multi_hot=True)])
    block = DistributedEmbeddings(schema, dim=2, sequence_combiner=None)
    for tags in (
        tf.constant([[1, 2, 3], [0, 1, 2]]),
        tf.constant([[[1], [2], [3]], [[0], [1], [2]]]),
    ):
        out = block({"user": tf.constant([1, 2]), "tags": tags})["tags"]
        assert isinstance(out, tf.Tensor) and out.shape == (2, 3, 2)
        table = block.get_global_weights()["tags"]
        np.testing.assert_allclose(out.numpy()[1, 2], table[2])


def test_shared_table_is_one_table_with_two_features(synthetic_schema):
    schema, features = first_batch("music-streaming", synthetic_schema)
    block = DistributedEmbeddings(schema, dim=4)
    out = block(features)
    genres = [t for t in block.tables if t.name == "genres"][0]
    assert {f.name for f in genres.features} == {"item_genres", "user_genres"}
    assert {"item_genres", "user_genres"} <= set(out)
    # a single variable row block serves both: changing the table changes both outputs
    arrays = block.get_global_weights()
    arrays["genres"] = arrays["genres"] * 0 + 1.0
    block.set_global_weights(arrays)
    out = block(features)
    for name in ("item_genres", "user_genres"):
        np.testing.assert_allclose(out[name].numpy(), np.ones_like(out[name].numpy()))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combiners_match_tf_embedding_lookup_sparse(combiner):
    schema = Schema([cat("tags", 49, multi_hot=True), cat("item", 9)])
    block = DistributedEmbeddings(schema, dim=3, sequence_combiner=combiner)
    ragged = tf.ragged.constant([[1, 2, 3], [], [4], [5, 5]], dtype=tf.int64)
    out = block({"tags": ragged, "item": tf.constant([[1], [2], [3], [4]])})
    table = block.get_global_weights()["tags"]
    want = tf.nn.embedding_lookup_sparse(
        tf.constant(table), ragged.to_sparse(), None, combiner=combiner
    )
    np.testing.assert_allclose(
        out["tags"].numpy()[[0, 2, 3]], want.numpy()[[0, 2, 3]], rtol=1e-5, atol=1e-7
    )
    np.testing.assert_array_equal(out["tags"].numpy()[1], np.zeros(3))  # empty row -> zeros
    assert out["item"].shape == (4, 3)


def test_registration_and_plan():
    assert mm.DistributedEmbeddings is DistributedEmbeddings
    merlin_models_de.register()  # idempotent
    assert mm.DistributedEmbeddings is DistributedEmbeddings
    block = DistributedEmbeddings(
        Schema([cat("a", 9), cat("b", 99)]), dim=4, strategy="memory_balanced", backend="horovod"
    )
    assert block.plan.world_size == 1 and len(block.plan.shards) == 2
    assert block.summary().startswith("backend=horovod\nShardingPlan: 2 tables")


@pytest.mark.full  # save and load: horovod/test_reload.py and test_fit.py
def test_config_round_trip_and_dlrm_save_load(tmp_path, synthetic_schema):
    ds = synthetic("criteo", 128)
    schema = ds.schema
    block = DistributedEmbeddings(
        schema,
        dim={"C1": 8},
        infer_dim_fn=lambda c: 8,
        embeddings_initializer="truncated_normal",
        strategy="memory_optimized",
        column_slice_threshold=10_000,
    )
    config = block.get_config()
    clone = DistributedEmbeddings.from_config(config)
    again = clone.get_config()
    # the schema JSON carries float statistics whose text can differ after a round trip
    assert {k: v for k, v in again.items() if k != "schema"} == {
        k: v for k, v in config.items() if k != "schema"
    }
    assert [(c.name, c.int_domain) for c in clone.schema] == [
        (c.name, c.int_domain) for c in block.schema
    ]
    assert clone.plan == block.plan
    # a few of the columns: a SavedModel traces every layer (~2 minutes for all 26 tables)
    from merlin.io import Dataset

    small = schema.select_by_name(["C1", "C2", "C3", "I1", "I2", "label"])
    ds = Dataset(ds.to_ddf()[small.column_names], schema=small)
    model = mm.DLRMModel(
        small,
        embeddings=DistributedEmbeddings(small, dim=8),
        bottom_block=mm.MLPBlock([8]),
        top_block=mm.MLPBlock([8]),
        prediction_tasks=mm.BinaryClassificationTask("label"),
    )
    model.compile(optimizer="adagrad")
    model.fit(mm.Loader(ds, batch_size=32), epochs=1, verbose=0)
    before = model.predict(mm.Loader(ds, batch_size=32, shuffle=False), verbose=0)
    model.save(str(tmp_path / "model"))
    loaded = tf.keras.models.load_model(str(tmp_path / "model"))
    after = loaded.predict(mm.Loader(ds, batch_size=32, shuffle=False), verbose=0)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


def test_errors_name_the_feature_and_value():
    schema = Schema([cat("user", 9), cat("tags", 4, multi_hot=True)])
    block = DistributedEmbeddings(schema, dim=2)
    ok = {"user": tf.constant([1, 2]), "tags": tf.ragged.constant([[1], [2, 3]], tf.int64)}
    block(ok)
    with pytest.raises(
        ValueError, match=r"Feature 'tags' is missing from the batch. Received keys: \['user'\]"
    ):
        block({"user": tf.constant([1, 2])})
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)An id is outside its table. Received: feature=.*user.*id=.*12.*rows=.*10",
    ):
        block({**ok, "user": tf.constant([1, 12])})
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"(?s)Received: feature=.*tags.*id=.*-1"
    ):
        block({**ok, "tags": tf.ragged.constant([[1], [-1]], tf.int64)})
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)Every feature must have the batch size of feature 'user'.*user.*tags.*2, 3",
    ):
        block({**ok, "tags": tf.ragged.constant([[1], [2], [3]], tf.int64)})
    with pytest.raises(ValueError, match=r"Received: backend='nccl'"):
        DistributedEmbeddings(schema, dim=2, backend="nccl")
    with pytest.raises(ValueError, match=r"Received: strategy='greedy'"):
        DistributedEmbeddings(schema, dim=2, strategy="greedy")
    with pytest.raises(
        ValueError, match=r"Table 'user' has shape \(10, 2\). Received: shape=\(3, 2\)"
    ):
        block.set_global_weights({"user": np.zeros((3, 2)), "tags": np.zeros((5, 2))})


def test_validation_off_skips_the_check_and_tf_names_feature_and_table():
    schema = Schema([cat("user", 9), cat("tags", 4, multi_hot=True)])
    block = DistributedEmbeddings(schema, dim=2, validate_ids=False)
    tags = tf.ragged.constant([[1]], tf.int64)
    block({"user": tf.constant([1]), "tags": tags})
    assert block.get_config()["exchange"]["validate_ids"] is False
    # no range check: on CPU TF's own gather error, named after the feature and table
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)indices.*= 12 is not in \[0, 10\).*lookup_user_in_table_user",
    ):
        block({"user": tf.constant([12]), "tags": tags})
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)lookup_tags_in_table_tags"):
        block({"user": tf.constant([1]), "tags": tf.ragged.constant([[7]], tf.int64)})


@pytest.mark.parametrize("kind", ["dcn", "hand-built"])
def test_goes_where_mm_embeddings_goes(kind):
    ds = synthetic("music-streaming", 128)
    schema = ds.schema
    inputs = mm.InputBlockV2(schema, categorical=mm.DistributedEmbeddings(schema, dim=8))
    if kind == "dcn":
        model = mm.DCNModel(
            schema,
            depth=1,
            deep_block=mm.MLPBlock([8]),
            input_block=inputs,
            prediction_tasks=mm.BinaryClassificationTask("click"),
        )
    else:
        model = mm.Model(inputs, mm.MLPBlock([8]), mm.BinaryClassificationTask("click"))
    model.compile(optimizer="adagrad")
    with TFLogRecords() as log:
        history = model.fit(mm.Loader(ds, batch_size=32), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not [m for m in log.messages if "Gradients do not exist" in m], log.messages
    block = [layer for layer in model._flatten_layers() if isinstance(layer, DistributedEmbeddings)]
    assert len(block) == 1 and block[0].built


def test_float_ids_and_huge_tables_are_refused_in_one_process():
    schema = Schema([cat("user", 9), cat("item", 2**40 - 1)])
    with pytest.raises(MemoryError, match=r"Rank 0 would hold 64.0 TiB.*table 'item'"):
        DistributedEmbeddings(schema, dim=16)({"user": tf.constant([1]), "item": tf.constant([1])})
    block = DistributedEmbeddings(Schema([cat("user", 9)]), dim=2)
    with pytest.raises(
        ValueError, match=r"Feature 'user' must hold integer ids. Received: dtype=float32"
    ):
        block({"user": tf.constant([1.7])})


@pytest.mark.parametrize(
    "optimizer, line",
    [
        (lambda: "sgd", "optimizer=sgd (+0 slot copies)"),
        (lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9), "optimizer=sgd (+1 slot copies)"),
        (lambda: tf.keras.optimizers.legacy.Adagrad(0.1), "optimizer=adagrad (+1 slot copies)"),
        (lambda: tf.keras.optimizers.Adam(amsgrad=True), "optimizer=adam (+3 slot copies)"),
        (lambda: mm.LazyAdam(), "optimizer=lazyadam (+2 slot copies)"),
    ],
)
def test_summary_counts_the_compiled_optimizers_slots(optimizer, line):
    schema = Schema([cat("user", 99), cat("item", 49)])
    block = DistributedEmbeddings(schema, dim=4)
    assert "optimizer=sgd (+0 slot copies)" in block.summary()  # not compiled yet
    model = mm.Model(block, mm.MLPBlock([4]), mm.BinaryOutput("click"))
    model.compile(optimizer=optimizer())
    assert line in block.summary()
    assert "optimizer=adam (+2 slot copies)" in block.summary("adam")  # a name given wins


@pytest.mark.parametrize("validate_ids", [True, False])
def test_a_uint64_id_above_int64_is_named_as_given(validate_ids):
    """2**63 + 5 read as int64 is negative: the error names it as the uint64 it was, with or
    without the range check of ids (before: the negative number, or TF's gather error)."""
    block = DistributedEmbeddings(Schema([cat("user", 9)]), dim=2, validate_ids=validate_ids)
    block({"user": tf.constant([1], tf.uint64)})
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)outside its table \(above int64's range\). Received: "
        r"feature=user id=.*\b9223372036854775813\b",
    ):
        block({"user": tf.constant([1, 2**63 + 5], tf.uint64)})
