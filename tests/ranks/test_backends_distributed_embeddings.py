"""backend='distributed-embeddings' against the oracle, its errors, and checkpoints that move
between the two backends. Skips where NVIDIA distributed-embeddings does not import."""

import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.backends.registry import is_importable
from merlin_models_de.persistence.checkpoint import (
    read_full_tables,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.planner import ShardingType
from merlin_models_de.variables import embedding_blocks
from tests.ranks import oracle
from tests.ranks import oracle_dlrm as fc
from tests.ranks.test_checkpoint import compiled, fit, rank_data, shared_dir, spec_for
from tests.ranks.test_errors import still_in_step
from tests.schemas import cat

pytestmark = pytest.mark.skipif(
    not is_importable("distributed-embeddings"),
    reason="NVIDIA distributed-embeddings does not import here",
)
DE = "distributed-embeddings"


def onehot_schema():
    """One-hot tables of several sizes and widths, and one table read by two features."""
    return Schema(
        [
            cat("user", 1999),
            cat("item", 999),
            cat("city", 49),
            cat("device", 6),
            cat("fav_genre", 79, domain_name="genre"),
            cat("last_genre", 79, domain_name="genre"),
        ]
    )


DIMS = {"user": 8, "item": 8, "city": 8, "device": 6, "genre": 8}
PLACEMENTS = [
    ("basic", dict(strategy="basic"), {ShardingType.TABLE_WISE}),
    (
        "balanced-column",
        dict(strategy="memory_balanced", column_slice_threshold=2000),
        {ShardingType.COLUMN_WISE},
    ),
    (
        "optimized-column",
        dict(strategy="memory_optimized", column_slice_threshold=3000),
        {ShardingType.COLUMN_WISE},
    ),
    (
        "data-parallel",
        dict(strategy="basic", data_parallel_threshold=700),
        {ShardingType.DATA_PARALLEL},
    ),
    pytest.param(
        "row-sliced",
        dict(strategy="memory_balanced", row_slice_threshold=3000),
        {ShardingType.ROW_WISE},
        marks=pytest.mark.skipif(
            not tf.config.list_physical_devices("GPU"),
            reason="DE's row slices need a GPU: they rely on GPU gathers returning "
            "zeros for ids outside a rank's rows (a CPU gather raises)",
        ),
    ),
]


def make_block(**options):
    return DistributedEmbeddings(onehot_schema(), dim=DIMS, backend=DE, **options)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("name, options, kinds", PLACEMENTS)
def test_de_matches_the_oracle(hvd, name, options, kinds, optimizer):
    block = make_block(**options)
    assert block.backend_name == DE and block.summary().startswith(f"backend={DE}")
    assert kinds <= {s.kind for s in block.plan.shards}
    oracle.assert_matches_oracle(block, optimizer, seed=sum(map(ord, name + optimizer)))


def test_de_adam_and_graph_mode_match_the_oracle(hvd):
    oracle.assert_matches_oracle(
        make_block(strategy="memory_balanced", column_slice_threshold=2000), "adam", seed=7
    )
    oracle.assert_matches_oracle(
        make_block(strategy="memory_optimized", column_slice_threshold=3000),
        "adagrad",
        seed=11,
        graph=True,
    )


def test_de_holds_only_this_ranks_share(hvd):
    block = make_block(strategy="memory_optimized", column_slice_threshold=3000)
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    local = sum(int(np.prod(v.shape)) for v in block.local_variables)
    assert local == block.plan.rank_elements(comm.rank())


def test_de_bad_id_fails_every_rank(hvd):
    block = make_block(strategy="memory_balanced")
    good = oracle.select(oracle.global_batch(block.features, block.tables, 8, 0), 0, 8)
    block(good)
    bad = dict(good)
    if comm.rank() == 1:
        bad["item"] = tf.constant([[1], [2], [3], [1000], [4], [5], [6], [7]], tf.int64)
        message = r"(?s)An id is outside its table. Received: feature=.*item.*id=.*1000"
    else:
        message = r"(?s)Invalid input on another rank \(this is rank 0\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        block(bad)
    still_in_step()
    size = 8 if comm.rank() == 0 else 6
    with pytest.raises(tf.errors.InvalidArgumentError, match="same per-rank batch size"):
        block(oracle.select(oracle.global_batch(block.features, block.tables, size, 1), 0, size))
    still_in_step()


def test_de_rejects_multi_hot_features_naming_them(hvd):
    schema = Schema([cat("user", 99), cat("tags", 49, multi_hot=True)])
    with pytest.raises(NotImplementedError, match=r"backend='horovod'.*feature 'tags'"):
        DistributedEmbeddings(schema, dim=4, backend=DE)


@pytest.mark.parametrize("first, second", [("horovod", DE), (DE, "horovod")])
def test_checkpoints_move_between_backends(hvd, tmp_path_factory, first, second):
    data = comm.broadcast_object(fc.make_data(2 * comm.size() * 16, seed=9))
    a = dict(spec_for("memory_optimized", column=3000), backend=first)
    b = dict(spec_for("memory_balanced"), backend=second)
    x, y = rank_data(data, a)
    saved, again = shared_dir(tmp_path_factory, "saved"), shared_dir(tmp_path_factory, "again")
    model = compiled(a, x)
    fit(model, x, y)
    path = save_checkpoint(model, saved)
    other = compiled(b, x)
    restore_checkpoint(other, saved)
    want = read_full_tables(path)
    (block,) = embedding_blocks(other)
    assert block.backend_name == second
    got = block.get_global_weights()
    for name, arrays in next(iter(want.values())).items():
        np.testing.assert_array_equal(got[name], arrays["table"], err_msg=name)
    fit(other, x, y)  # optimizer slots restored too: training goes on
    save_checkpoint(other, again)
