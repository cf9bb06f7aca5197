"""Sliced tables start as mm.Embeddings' whole tables would: a fan-based initializer draws each
rank's shard with the whole table's variance; whole-matrix initializers fail every rank."""
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.planner import ShardingType
from tests.unit.helpers import cat
from tests.unit.horovod import oracle


def make_block(initializer):
    # "wide" (64 x 64) is split by columns, "tall" (4000 x 16) by rows
    return DistributedEmbeddings(Schema([cat("wide", 63), cat("tall", 3999)]),
                                 dim={"wide": 64, "tall": 16}, backend="horovod",
                                 embeddings_initializer=initializer,
                                 column_slice_threshold=2048, row_slice_threshold=60_000)


def build(block):
    block(oracle.select(oracle.global_batch(block.features, block.tables, 8, seed=0), 0, 8))


def test_glorot_shards_span_the_whole_tables_limit(hvd):
    block = make_block("glorot_uniform")
    assert block.plan.kind_of("wide") is ShardingType.COLUMN_WISE
    assert block.plan.kind_of("tall") is ShardingType.ROW_WISE
    build(block)
    for shard in block.plan.shards_on(comm.rank()):
        table = block.plan.table(shard.table)
        variable, first = block.backend.shard_variable(shard)
        values = variable.numpy()[first:first + shard.rows]
        assert values.shape == (shard.rows, shard.cols)
        limit = np.sqrt(6 / (table.rows + table.dim))  # the whole table's Glorot limit
        top = np.abs(values).max()
        # the shard's own limit would be 0.25 (64 x 32) or 0.0546 (2000 x 16)
        assert limit * 0.99 < top <= limit * (1 + 1e-6), (shard, top, limit)


def test_orthogonal_on_a_split_table_fails_every_rank(hvd):
    block = make_block({"wide": "uniform", "tall": "orthogonal"})
    with pytest.raises(ValueError, match=r"Table 'tall' is split across ranks \(row_wise, shard "
                                         r"2000x16 of 4000x16\).*Orthogonal"):
        build(block)
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()  # nobody hangs
