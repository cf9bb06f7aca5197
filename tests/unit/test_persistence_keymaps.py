"""Dynamic tables in a sharded checkpoint, one process (merlin_models_de/persistence/
keymaps.py): each rank's key map is saved beside its shard and restored whole, slots,
candidates and counters included; a missing map file and a table of the other kind are named.
Restores into other world sizes: tests/ranks/test_dynamic_checkpoint.py."""

import os

import merlin.dtypes as md
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)
from merlin_models_de import DynamicTable
from merlin_models_de.block.layer import DistributedEmbeddings
from merlin_models_de.dynamic.contents import local_map
from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.persistence.keymaps import notices
from merlin_models_de.persistence.manifest import check_complete, read_manifest
from tests.schemas import cat

OPTION = DynamicTable(capacity=6, admit_after=2, evict="lru")


def block(item=None):
    item = item or ColumnSchema("item", dtype=md.int64, tags=[Tags.CATEGORICAL])
    dynamic = {"item": OPTION} if item.int_domain is None else None
    return DistributedEmbeddings(Schema([cat("user", 9), item]), dim=3, dynamic_tables=dynamic)


def trained():
    """6 rows for 9 keys seen twice or more, 3 seen once (candidates): lru evicts."""
    emb = block()
    for keys in ([1, 1, 2, 2, 3], [3, 4, 4, 5, 5], [6, 6, 7, 7, 8], [8, 9, 9, 10, 11], [12] * 5):
        emb(
            {
                "user": tf.zeros([len(keys), 1], tf.int64),
                "item": tf.constant(keys, tf.int64)[:, None] + 10**12,
            },
            training=True,
        )
    return emb


def test_a_restore_gives_back_every_slot_candidate_and_counter(tmp_path):
    emb = trained()
    assert emb.dynamic_counters()["item"]["evicted"] > 0
    save_checkpoint(emb, str(tmp_path))
    fresh = block()
    fresh.dynamic_counters()  # built
    restored = restore_checkpoint(fresh, str(tmp_path))
    before, after = local_map(emb.backend.keymaps["item"]), local_map(fresh.backend.keymaps["item"])
    for what in ("keymap", "candidates", "counters"):  # every slot where it was
        np.testing.assert_array_equal(after[what], before[what], err_msg=what)
    np.testing.assert_array_equal(fresh.backend.rw["item"].numpy(), emb.backend.rw["item"].numpy())
    np.testing.assert_array_equal(
        fresh.backend.defaults["item"].numpy(), emb.backend.defaults["item"].numpy()
    )
    waiting = int((before["candidates"][:, 1] > 0).sum())
    assert restored["rehomed"] == [
        {("embeddings", "item"): {"keys": 6, "evicted": 0, "candidates": waiting, "forgotten": 0}}
    ]
    # the index is rebuilt: a key restored finds its row
    keys, rows = fresh.dynamic_table("item")
    assert len(keys) == 6
    out = fresh({"user": tf.zeros([1, 1], tf.int64), "item": tf.constant([[keys[0]]])})
    np.testing.assert_array_equal(out["item"].numpy(), rows[:1])
    # read_full_tables shows the map in row order
    full = read_full_tables(latest_checkpoint(str(tmp_path)))["embeddings"]["item"]
    np.testing.assert_array_equal(full["keymap"], before["keymap"])


def test_a_missing_key_map_file_is_named(tmp_path):
    emb = trained()
    path = save_checkpoint(emb, str(tmp_path))
    manifest = read_manifest(path)
    stems = manifest.blocks[0].maps["item"].stems
    assert sorted(stems) == ["candidates", "counters", "keymap"]
    missing = os.path.join(path, stems["candidates"] + "-r0.npy")
    os.remove(missing)
    with pytest.raises(StorageError, match=f"File {missing} is missing"):
        check_complete(path)
    fresh = block()
    fresh.dynamic_counters()
    with pytest.raises(StorageError, match=f"File {missing} is missing"):
        restore_checkpoint(fresh, str(tmp_path))


def test_a_table_of_the_other_kind_is_named(tmp_path):
    save_checkpoint(trained(), str(tmp_path))
    fixed = block(cat("item", 5))  # 6 rows too, found by row id
    fixed.get_global_weights()  # built
    with pytest.raises(
        StorageError, match="table 'item': the checkpoint's table is dynamic, the model's fixed"
    ):
        restore_checkpoint(fixed, str(tmp_path))


def test_the_notice_names_the_table_and_counts_per_rank():
    per_rank = [
        {("emb", "item"): {"keys": 11, "evicted": 3, "candidates": 10, "forgotten": 2}},
        {("emb", "item"): {"keys": 5, "evicted": 0, "candidates": 2, "forgotten": 0}},
        {("emb", "item"): {"keys": 4, "evicted": 1, "candidates": 0, "forgotten": 0}},
    ]
    assert notices(per_rank, 1) == [
        "merlin_models_de: dynamic table 'item' (block 'emb') restored from 1 rank(s) into 3: "
        "4 of 20 keys evicted by its policy, their new owner's share being full (per rank: "
        "[3, 0, 1]); 2 of 12 candidates forgotten (per rank: [2, 0, 0])."
    ]
    quiet = [{("emb", "item"): {"keys": 4, "evicted": 0, "candidates": 0, "forgotten": 0}}]
    assert notices(quiet, 2) == []
