"""Sliced tables start as mm.Embeddings' whole tables would: a fan-based initializer draws each
rank's shard with the whole table's variance; whole-matrix initializers fail every rank."""

import numpy as np
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.planner import ShardingType
from tests.ranks import oracle
from tests.schemas import cat


def make_block(initializer):
    # "wide" (64 x 64) is split by columns, "tall" (4000 x 16) by rows
    return DistributedEmbeddings(
        Schema([cat("wide", 63), cat("tall", 3999)]),
        dim={"wide": 64, "tall": 16},
        backend="horovod",
        embeddings_initializer=initializer,
        column_slice_threshold=2048,
        row_slice_threshold=60_000,
    )


def build(block):
    block(oracle.select(oracle.global_batch(block.features, block.tables, 8, seed=0), 0, 8))


def built_twice_after_the_same_seed():
    """The second block of two built after set_random_seed(3), and both blocks' tables."""
    tables = []
    for _ in range(2):
        tf.keras.utils.set_random_seed(3)
        block = make_block("uniform")
        build(block)
        tables.append(block.get_global_weights())
    return block, tables


def test_glorot_shards_span_the_whole_tables_limit(hvd):
    block = make_block("glorot_uniform")
    assert block.plan.kind_of("wide") is ShardingType.COLUMN_WISE
    assert block.plan.kind_of("tall") is ShardingType.ROW_WISE
    build(block)
    for shard in block.plan.shards_on(comm.rank()):
        table = block.plan.table(shard.table)
        variable, first = block.backend.shard_variable(shard)
        values = variable.numpy()[first : first + shard.rows]
        assert values.shape == (shard.rows, shard.cols)
        limit = np.sqrt(6 / (table.rows + table.dim))  # the whole table's Glorot limit
        top = np.abs(values).max()
        # the shard's own limit would be 0.25 (64 x 32) or 0.0546 (2000 x 16)
        assert limit * 0.99 < top <= limit * (1 + 1e-6), (shard, top, limit)


def test_shards_are_independent_after_the_same_seed_on_every_rank(hvd):
    """set_random_seed(3) on both ranks: the halves of each split table still differ (each
    shard has its own seed), and a second block built the same way starts the same."""
    block, tables = built_twice_after_the_same_seed()
    wide, tall = tables[0]["wide"], tables[0]["tall"]
    assert np.abs(wide[:, :32] - wide[:, 32:]).max() > 0.01
    assert np.abs(tall[:2000] - tall[2000:]).max() > 0.01
    for name in ("wide", "tall"):
        np.testing.assert_array_equal(tables[0][name], tables[1][name])


def test_orthogonal_split_table_is_one_orthogonal_matrix(hvd):
    """Each rank draws the whole table from a seed every rank shares and keeps its rows."""
    block = make_block({"wide": "uniform", "tall": "orthogonal"})
    build(block)
    tall = block.get_global_weights()["tall"]
    np.testing.assert_allclose(tall.T @ tall, np.eye(16), atol=1e-4)


def test_large_shards_are_drawn_by_blocks_of_rows_with_their_own_seeds(hvd, monkeypatch):
    """Shards above BLOCK_BYTES (here 4 KB) start from zeros and are filled a block of rows
    at a time: each block is the draw of the shard's initializer reseeded for that block, the
    halves of the row-split table differ, and the same seed starts the same block again."""
    from merlin_models_de.backends import shard_init

    monkeypatch.setattr(shard_init, "BLOCK_BYTES", 4096)
    block, tables = built_twice_after_the_same_seed()
    for shard in block.plan.shards_on(comm.rank()):
        variable, first = block.backend.shard_variable(shard)
        values = variable.numpy()[first : first + shard.rows]
        spec = block.plan.table(shard.table)
        base_seed, shared_seed = block.backend.init_seeds
        init = shard_init.for_shard(
            tf.keras.initializers.get("uniform"),
            (spec.rows, spec.dim),
            (shard.rows, shard.cols),
            start=(shard.row_start, shard.col_start),
            table=shard.table,
            base_seed=base_seed,
            shared_seed=shared_seed,
        )
        blocks = shard_init.row_blocks(init, (shard.rows, shard.cols), tf.float32)
        assert len(blocks) == -(-shard.rows * shard.cols * 4 // 4096), shard  # 4 KB each
        want = np.concatenate([b((rows, shard.cols)).numpy() for _, rows, b in blocks])
        np.testing.assert_array_equal(values, want)
    tall = tables[0]["tall"]
    assert np.abs(tall[:2000] - tall[2000:]).max() > 0.01
    for name in ("wide", "tall"):
        np.testing.assert_array_equal(tables[0][name], tables[1][name])
