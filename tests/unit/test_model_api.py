"""Merlin's model-level API around the block, in one process, against mm.Embeddings: tables
found and frozen by name, what Keras and Merlin find when they walk the model, optimizers per
block (MultiOptimizer, LazyAdam), and mm.Embeddings' construction arguments."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.datasets.synthetic import generate_data
from merlin.models.tf.utils.tf_utils import get_sub_blocks

from merlin_models_de import DistributedEmbeddings
from merlin_models_de.block.handles import TableHandle

FEATURES = ["user_categories", "item_category", "user_age", "click"]
TABLES = ["user_categories", "item_category", "user_age"]


@pytest.fixture(scope="module")
def data():
    dataset = generate_data("e-commerce", 256)
    dataset.schema = dataset.schema.select_by_name(FEATURES)
    return dataset


def build(data, make):
    """A small model around ``make(schema)`` (the block or mm.Embeddings), built."""
    schema = data.schema
    tf.keras.utils.set_random_seed(1)
    emb = make(schema.select_by_name(TABLES))
    model = mm.Model(
        mm.InputBlockV2(schema, categorical=emb),
        mm.MLPBlock([4], name="layer_1"),
        mm.BinaryClassificationTask("click"),
    )
    loader = mm.Loader(data, batch_size=64, shuffle=False)
    model(mm.sample_batch(loader, include_targets=False))
    return model, emb, loader


def twins(data):
    """mm.Embeddings' model and the block's, with the same weights."""
    ref, ref_emb, loader = build(data, lambda s: mm.Embeddings(s, dim=4))
    got, emb, _ = build(data, lambda s: DistributedEmbeddings(s, dim=4))
    emb.set_global_weights({t: ref_emb[t].table.embeddings.numpy() for t in TABLES})
    dense = [w for w in ref.weights if "embedding" not in w.name]
    mine = [w for w in got.weights if not any(w is v for v in emb.weights)]
    assert [tuple(w.shape) for w in mine] == [tuple(w.shape) for w in dense]
    for w, v in zip(mine, dense):
        w.assign(v)
    return ref, ref_emb, got, emb, loader


def tables_of(emb):
    if isinstance(emb, DistributedEmbeddings):
        return emb.get_global_weights()
    return {t: emb[t].table.embeddings.numpy() for t in TABLES}


def test_tables_are_found_frozen_and_resumed_by_name(data):
    model, emb, loader = build(data, lambda s: DistributedEmbeddings(s, dim=4))
    found = model.get_blocks_by_name(["user_categories", "item_category"])
    assert sorted(b.name for b in found) == ["item_category", "user_categories"]
    table = model.get_blocks_by_name("user_categories")[0]
    assert table is emb["user_categories"] and isinstance(table, mm.Block)
    assert len(table.trainable_weights) == 1 and table.count_params() == 4 * table.input_dim

    model.freeze_blocks(["user_categories"])
    assert table.trainable is False and table.trainable_weights == []
    assert len(table.non_trainable_weights) == 1
    assert emb.get_config()["trainable"] == {
        "user_categories": False,
        "item_category": True,
        "user_age": True,
    }
    before = emb.get_global_weights()
    model.compile(optimizer="adagrad", run_eagerly=False)
    model.fit(loader, epochs=1, verbose=0)
    after = emb.get_global_weights()
    np.testing.assert_array_equal(after["user_categories"], before["user_categories"])
    assert not np.allclose(after["item_category"], before["item_category"])
    slots = model.optimizer.get_slot_names()
    assert all(
        model.optimizer.get_slot(v, s) is not None
        for s in slots
        for v in emb["item_category"].weights
    )
    with pytest.raises(KeyError):  # the frozen table got no slots
        model.optimizer.get_slot(table.weights[0], slots[0])

    model.unfreeze_blocks(["user_categories"])
    assert table.trainable is True and len(table.trainable_weights) == 1
    assert emb.get_config()["trainable"] is True
    model.compile(optimizer="adagrad", run_eagerly=False)
    model.fit(loader, epochs=1, verbose=0)
    assert not np.allclose(emb.get_global_weights()["user_categories"], after["user_categories"])


def test_freezing_the_block_freezes_every_table_and_unfreezing_resumes_them(data):
    model, emb, loader = build(data, lambda s: DistributedEmbeddings(s, dim=4))
    model.freeze_blocks(["embeddings"])
    assert all(b.trainable is False for b in get_sub_blocks([emb]))
    assert not any(any(v is w for w in emb.weights) for v in model.trainable_weights)
    model.unfreeze_all_frozen_blocks()
    assert all(emb[t].trainable for t in TABLES) and len(emb.trainable_weights) == 4  # + anchor


def test_walking_the_model_finds_layers_as_with_mm_embeddings(data):
    ref, ref_emb, got, emb, _ = twins(data)
    handles = [b for b in get_sub_blocks([emb]) if isinstance(b, TableHandle)]
    assert sorted(h.name for h in handles) == sorted(TABLES)
    assert all(h.built for h in handles)
    assert {h.name for h in emb.submodules} >= set(TABLES)
    # the same parameters; the block adds its exchange anchor (one scalar)
    assert got.count_params() == ref.count_params() + 1
    assert len(got.trainable_weights) == len(ref.trainable_weights) + 1
    for t in TABLES:
        assert emb[t].count_params() == ref_emb[t].count_params()
    lines = []
    got.summary(expand_nested=True, show_trainable=True, line_length=100, print_fn=lines.append)
    for t in TABLES:
        row = next(line for line in lines if f" {t} (TableHandle)" in line)
        assert str(ref_emb[t].count_params()) in row.split(), row


def test_checkpoints_hold_the_same_names_with_frozen_tables(data, tmp_path):
    model, emb, _ = build(data, lambda s: DistributedEmbeddings(s, dim=4))
    plain = tf.train.Checkpoint(model=model).save(str(tmp_path / "plain"))
    model.freeze_blocks(["user_categories"])
    saved = emb.get_global_weights()
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "frozen"))
    assert [n for n, _ in tf.train.list_variables(path)] == [
        n for n, _ in tf.train.list_variables(plain)
    ]
    again, emb2, _ = build(data, lambda s: DistributedEmbeddings(s, dim=4))
    tf.train.Checkpoint(model=again).restore(path).assert_existing_objects_matched()
    for t, value in emb2.get_global_weights().items():
        np.testing.assert_array_equal(value, saved[t])


@pytest.mark.parametrize("group", ["table", "block"])
def test_multi_optimizer_with_lazy_adam_trains_as_with_mm_embeddings(data, group):
    ref, ref_emb, got, emb, loader = twins(data)
    results = []
    for model, block in ((ref, ref_emb), (got, emb)):
        named = block["user_categories"] if group == "table" else block
        opt = mm.MultiOptimizer(
            default_optimizer=tf.keras.optimizers.legacy.SGD(0.1),
            optimizers_and_blocks=[mm.OptimizerBlocks(mm.LazyAdam(0.05), named)],
        )
        model.compile(optimizer=opt, run_eagerly=False)
        before = tables_of(block)
        model.fit(loader, epochs=1, verbose=0)
        results.append((before, tables_of(block), opt))
    (_, ref_after, _), (before, after, opt) = results
    for t in TABLES:
        np.testing.assert_allclose(after[t], ref_after[t], rtol=1e-5, atol=1e-6, err_msg=t)
    lazy = opt.optimizers_and_blocks[0].optimizer
    var = emb["user_categories"].weights[0]
    assert lazy.get_slot(var, "m").shape == var.shape  # LazyAdam holds this table's slots
    assert not np.allclose(after["user_categories"], before["user_categories"])


def test_embedding_options_are_ignored_as_mm_embeddings_ignores_them(data):
    """mm.Embeddings drops EmbeddingOptions' fields (its tables do not take them), so the
    table sizes come from ``dim`` / ``infer_dim_fn``; Merlin's Wide&Deep passes some."""
    schema = data.schema.select_by_name(TABLES)
    for kwargs in (
        {"infer_embedding_sizes": True},
        {
            "infer_embedding_sizes": True,
            "infer_embedding_sizes_multiplier": 5.0,
            "embedding_dim_default": 3,
            "embedding_dims": {"user_age": 7},
            "infer_embeddings_ensure_dim_multiple_of_8": True,
        },
        {"dim": {"user_age": 5}, "embedding_dim_default": 8, "infer_embedding_sizes": False},
    ):
        ref = mm.Embeddings(schema, **kwargs)
        got = DistributedEmbeddings(schema, **kwargs)
        assert {t.name: t.dim for t in got.tables} == {
            name: table.dim for name, table in ref.parallel_dict.items()
        }, kwargs


def test_defaults_of_mm_embeddings_signature_are_accepted(data):
    """None where mm.Embeddings' signature defaults to None or 0.0 means the same here."""
    schema = data.schema.select_by_name(TABLES)
    got = DistributedEmbeddings(
        schema,
        dim=4,
        trainable=None,
        embeddings_initializer=None,
        embeddings_regularizer=None,
        activity_regularizer=None,
        l2_batch_regularization_factor=None,
        block_name="emb",
    )
    assert got.name == "emb" and all(got[t].trainable for t in TABLES)
    with pytest.raises(TypeError, match="embedding_dim_defualt"):
        DistributedEmbeddings(schema, dim=4, embedding_dim_defualt=8)
