"""The block's dynamic tables (merlin_models_de/block/dynamic.py): the backend that runs
them, their options through the block's config, and the calls that must not count keys."""

import logging

import merlin.dtypes as md
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de import DynamicTable
from merlin_models_de.block.layer import DistributedEmbeddings
from tests.schemas import cat


def schema():
    return Schema([cat("user", 9), ColumnSchema("item", dtype=md.int64, tags=[Tags.CATEGORICAL])])


def block(**options):
    return DistributedEmbeddings(
        schema(), dim=3, dynamic_tables={"item": DynamicTable(capacity=5, **options)}
    )


def test_another_backend_refuses_dynamic_tables():
    with pytest.raises(NotImplementedError, match="Received: backend='distributed-embeddings'"):
        DistributedEmbeddings(
            schema(),
            dim=3,
            backend="distributed-embeddings",
            dynamic_tables={"item": DynamicTable(capacity=5)},
        )


def test_the_config_holds_the_options():
    emb = block(admit_after=2)
    copy = DistributedEmbeddings.from_config(emb.get_config())
    assert copy.dynamic_tables == {"item": DynamicTable(capacity=5, admit_after=2)}
    assert next(t for t in copy.tables if t.name == "item").rows == 5


def test_dynamic_tables_must_be_a_dict():
    with pytest.raises(ValueError, match="Received: dynamic_tables=\\['item'\\]"):
        DistributedEmbeddings(schema(), dim=3, dynamic_tables=["item"])


def test_a_dynamic_table_shared_by_two_features_is_refused_naming_them():
    shared = Schema([cat("item", 9, domain_name="items"), cat("last_item", 9, domain_name="items")])
    with pytest.raises(NotImplementedError, match=r"'items' is shared by \['item', 'last_item'\]"):
        DistributedEmbeddings(shared, dim=3, dynamic_tables={"items": DynamicTable(capacity=5)})


def test_a_selections_placeholder_ids_are_not_counted_as_keys():
    emb = block()
    view = emb.select_by_names_view(["user"])
    view({"user": tf.constant([[1], [2]], tf.int64)}, training=True)
    assert emb.dynamic_counters()["item"] == {"keys": 0, "admitted": 0, "evicted": 0}


def test_uint64_keys_above_int64_are_keys():
    emb = block()
    keys = tf.constant([[2**63 + 5], [7]], tf.uint64)
    emb({"user": tf.constant([[1], [2]], tf.int64), "item": keys}, training=True)
    found, _ = emb.dynamic_table("item")
    assert sorted(found.tolist()) == [-(2**63) + 5, 7]  # read back as int64, two's complement


def test_freezing_a_dynamic_table_freezes_its_default_row():
    emb = block()
    emb({"user": tf.constant([[1]], tf.int64), "item": tf.constant([[4]], tf.int64)})
    default = emb.backend.defaults["item"]
    assert any(w is default for w in emb.trainable_weights)
    emb["item"].trainable = False
    assert not any(w is default for w in emb.trainable_weights)


def test_training_outside_fit_warns_once_that_reused_rows_keep_their_state(caplog):
    from merlin_models_de.dynamic.reset import warn_unreset_state

    warn_unreset_state.cache_clear()  # once per process: other tests may have warned
    emb = block()
    with caplog.at_level(logging.WARNING, logger="merlin_models_de"):
        for _ in range(2):
            emb(
                {"user": tf.constant([[1]], tf.int64), "item": tf.constant([[4]], tf.int64)},
                training=True,
            )
    assert [r.getMessage() for r in caplog.records].count(
        "Dynamic table 'item' is trained outside Merlin's fit: keys are admitted, but a row "
        "taken from an evicted key keeps that key's optimizer state (docs/dynamic.md)."
    ) == 1


def test_the_summary_gives_each_dynamic_tables_counters_on_this_rank():
    emb = block()
    assert "dynamic table" not in emb.summary()  # not built: nothing counted yet
    full = tf.constant([[3], [4], [3], [8], [9], [10]], tf.int64)  # 5 keys fill 5 rows
    emb({"user": tf.constant([[1]] * 6, tf.int64), "item": full}, training=True)
    # a new key takes the least used row of an earlier step (lfu)
    emb(
        {"user": tf.constant([[1]], tf.int64), "item": tf.constant([[11]], tf.int64)}, training=True
    )
    lines = emb.summary().splitlines()
    assert lines[-1] == (
        "dynamic table 'item' on this rank: 5 keys with a row of 5, 6 admitted, 1 evicted "
        "(dynamic_counters() sums every rank)"
    )
    assert emb.dynamic_counters()["item"] == {"keys": 5, "admitted": 6, "evicted": 1}
