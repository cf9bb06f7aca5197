"""A dynamic table in one process: what it holds and counts (merlin_models_de/dynamic/
contents.py), keys that get rows only in training, the default row for the others, and the
options refused with the value received."""

import merlin.dtypes as md
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)
from merlin_models_de import DynamicTable
from merlin_models_de.block.layer import DistributedEmbeddings
from merlin_models_de.planner import plan
from merlin_models_de.tables import tables_from_schema
from tests.schemas import cat


def schema(item_dtype=md.int64):
    return Schema([cat("user", 9), ColumnSchema("item", dtype=item_dtype, tags=[Tags.CATEGORICAL])])


def block(**options):
    return DistributedEmbeddings(
        schema(), dim=3, dynamic_tables={"item": DynamicTable(capacity=5, **options)}
    )


def test_training_gives_keys_rows_and_other_calls_read_the_default_row():
    emb = block()
    keys = tf.constant([[10**12 + 2], [-5], [10**12 + 2]], tf.int64)
    users = tf.constant([[1], [2], [3]], tf.int64)
    before = emb({"user": users, "item": keys}, training=False)["item"].numpy()
    default = emb.backend.defaults["item"].numpy()
    np.testing.assert_array_equal(before, np.repeat(default, 3, axis=0))
    assert emb.dynamic_counters() == {"item": {"keys": 0, "admitted": 0, "evicted": 0}}
    after = emb({"user": users, "item": keys}, training=True)["item"].numpy()
    found, rows = emb.dynamic_table("item")
    assert found.tolist() == [-5, 10**12 + 2]  # sorted by key
    np.testing.assert_array_equal(after[[1, 0]], rows)
    assert emb.dynamic_counters() == {"item": {"keys": 2, "admitted": 2, "evicted": 0}}
    emb({"user": users, "item": keys + 1}, training=False)  # unseen: no row is given
    assert emb.dynamic_counters()["item"]["keys"] == 2


def test_a_full_table_evicts_and_counts_it():
    emb = block(evict="lru")
    for start in range(0, 12, 3):
        emb(
            {"user": tf.zeros([3, 1], tf.int64), "item": tf.range(start, start + 3)[:, None]},
            training=True,
        )
    counts = emb.dynamic_counters()["item"]
    # every key finds a row (the 3 of a step never fill 5 rows), 12 - 5 of them by eviction
    assert counts == {"keys": 5, "admitted": 12, "evicted": 7}


def test_reading_a_table_that_is_not_dynamic_names_it():
    emb = block()
    with pytest.raises(ValueError, match=r"'user' is not a dynamic table.*\['item'\]"):
        emb.dynamic_table("user")


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(capacity=0), "capacity to be an int >= 1. Received: capacity=0"),
        (dict(capacity=5, admit_after=0), "Received: admit_after=0"),
        (dict(capacity=5, evict="fifo"), "Received: evict='fifo'"),
        (dict(capacity=5, evict="ttl"), "Received: evict='ttl', ttl=None"),
        (dict(capacity=5, ttl=3), "Received: evict='lfu', ttl=3"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        DynamicTable(**options)


def test_a_dynamic_feature_of_strings_is_refused_naming_it():
    with pytest.raises(ValueError, match="'item' must hold integer keys.*dtype='string'"):
        tables_from_schema(schema(md.string), 4, dynamic={"item": DynamicTable(capacity=5)})


def test_a_capacity_below_one_row_per_rank_is_refused():
    tables = tables_from_schema(schema(), 4, dynamic={"item": DynamicTable(capacity=3)})
    with pytest.raises(ValueError, match="'item' needs a capacity of at least one row per rank"):
        plan(tables, 4)


def test_a_map_read_as_arrays_loads_into_another_block():
    """local_map / load_map: what a sharded checkpoint saves of a rank's map and restores."""
    from merlin_models_de.dynamic.contents import load_map, local_map

    emb, other = block(admit_after=2), block(admit_after=2)
    other.dynamic_counters()  # built
    for start in (0, 2, 4):  # keys 0, 2, 4 admitted; 1, 3, 5 wait as candidates
        keys = tf.constant([[start], [start], [start + 1]], tf.int64)
        emb({"user": tf.zeros([3, 1], tf.int64), "item": keys}, training=True)
    arrays = local_map(emb.backend.keymaps["item"])
    assert arrays["keymap"].shape == (5, 3) and arrays["candidates"].shape == (5, 3)
    assert arrays["counters"].tolist() == [4, 3, 0]  # step, admitted, evicted
    other.backend.rw["item"].assign(emb.backend.rw["item"])
    load_map(
        other.backend.keymaps["item"], arrays["keymap"], arrays["candidates"], arrays["counters"]
    )
    for what, value in local_map(other.backend.keymaps["item"]).items():
        np.testing.assert_array_equal(value, arrays[what], err_msg=what)
    for got, want in zip(other.dynamic_table("item"), emb.dynamic_table("item")):
        np.testing.assert_array_equal(got, want)
    assert other.dynamic_counters() == emb.dynamic_counters()


def test_the_plan_counts_each_ranks_key_map():
    from merlin_models_de.planner.types import KEY_MAP_BYTES_PER_ROW

    dynamic = plan(tables_from_schema(schema(), 4, dynamic={"item": DynamicTable(capacity=9)}), 2)
    for rank, share in ((0, 5), (1, 4)):  # 9 rows: the first rank one more
        shards = dynamic.shards_on(rank)
        table_bytes = sum(s.elements for s in shards) * 4
        assert dynamic.rank_bytes(rank) == table_bytes + share * KEY_MAP_BYTES_PER_ROW
