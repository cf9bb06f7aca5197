"""Table lookups of arbitrary ids (different counts per rank) for every sharding kind:
equal to indexing the full table, differentiable on the single-process scale, and bad ids
fail every rank."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.merlin.training import DistributedGradientTape
from merlin_models_de.planner.types import ShardingType
from tests.ranks import oracle
from tests.ranks.test_oracle import PLACEMENTS


def make_block(**options):
    return DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        backend="horovod",
        sequence_combiner=oracle.COMBINERS,
        **options,
    )


def rank_ids(rows, seed):
    """Different id counts on each rank (rank r looks up 3 + 4r ids)."""
    rng = np.random.default_rng(seed + comm.rank())
    return rng.integers(0, rows, 3 + 4 * comm.rank())


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("case", PLACEMENTS, ids=[p[0] for p in PLACEMENTS])
def test_lookups_equal_the_full_table_and_train_like_one_process(hvd, case, mode):
    block = make_block(**case[1])
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    arrays = oracle.global_tables(block.tables, seed=3)
    block.set_global_weights(arrays)
    lookup = (
        tf.function(block.backend.lookup_table) if mode == "graph" else block.backend.lookup_table
    )
    for t in block.tables:
        ids = rank_ids(t.rows, seed=len(t.name))
        got = lookup(t.name, tf.constant(ids))
        np.testing.assert_allclose(got.numpy(), arrays[t.name][ids], rtol=0, atol=0, err_msg=t.name)
    assert_trains_like_one_process(block, "user", rank_ids(2000, seed=9))


@pytest.mark.parametrize(
    "kind",
    [ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE],
    ids=lambda k: k.value,
)
def test_a_rank_with_no_ids_trains_like_one_process(hvd, kind):
    """In a graph, rank 0 looks up no ids of a table the last rank owns (a table slice) or
    holds a slice of (column and row slices): it asks and answers nothing, yet runs every
    collective both ways, and the gradient is one process's."""
    placement = {
        ShardingType.TABLE_WISE: "basic",
        ShardingType.COLUMN_WISE: "basic-column",
        ShardingType.ROW_WISE: "row-sliced",
    }[kind]
    block = make_block(**next(p[1] for p in PLACEMENTS if p[0] == placement))
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    last = comm.size() - 1
    table = next(
        t
        for t in block.tables
        if {s.kind for s in block.plan.shards_of(t.name)} == {kind}
        and last in {s.rank for s in block.plan.shards_of(t.name)}
    )
    ids = [] if comm.rank() == 0 else [i % table.rows for i in (5, 5, 0, 1234, 7)]
    assert_trains_like_one_process(block, table.name, ids, graph=True)


def assert_trains_like_one_process(block, table, ids, graph=False):
    """The gradient of every rank's sum of its looked-up rows (column c weighted c + 1, so
    columns joined out of order show) equals one process's.

    One process would add the weights once per id over all ranks; as a mean over N ranks'
    losses, each table row's gradient is that sum / N... times N after Horovod's scaling
    of local gradients."""
    variables = block.trainable_variables
    rows, dim = block.plan.table(table).rows, block.plan.table(table).dim
    weights = np.arange(1, dim + 1, dtype=np.float32)

    def grads(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(block.backend.lookup_table(table, ids) * weights)
        return DistributedGradientTape(tape, block).gradient(loss, variables)

    got_grads = (tf.function(grads) if graph else grads)(tf.constant(ids, tf.int64))
    every = comm.allgather_object(np.asarray(ids, np.int64).tolist())
    all_ids = np.concatenate([np.asarray(x, np.int64) for x in every])
    want = np.zeros((rows, dim), np.float32)
    np.add.at(want, all_ids, weights / comm.size())
    mine = [s for s in block.plan.shards_on(comm.rank()) if s.table == table]
    for s in mine:
        var = block.backend.shard_variable(s)[0]
        grad = next(g for v, g in zip(variables, got_grads) if v is var)
        np.testing.assert_allclose(
            tf.convert_to_tensor(grad).numpy(),  # a shard's variable holds just its rows
            want[s.row_start : s.row_start + s.rows, s.col_start : s.col_start + s.cols],
            rtol=1e-6,
            atol=1e-7,
            err_msg=f"{table}: {s}",
        )


def test_a_bad_id_on_one_rank_fails_every_rank(hvd):
    block = make_block(strategy="basic")
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    ids = tf.constant([1, 2000] if comm.rank() == 1 else [1, 2, 3], tf.int64)
    message = (
        r"(?s)An id is outside table 'user' \(valid ids are 0..1999\).*2000"
        if comm.rank() == 1
        else r"Invalid ids for table 'user' on another rank"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        block.backend.lookup_table("user", ids)
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()


@pytest.mark.parametrize("case", PLACEMENTS, ids=[p[0] for p in PLACEMENTS])
def test_several_lookups_in_one_graph_and_a_rank_with_no_ids(hvd, case):
    """Two lookups of one table and one of another in one tf.function pair up across ranks
    (unique collective names per call); rank 0 looks nothing up in the second call."""
    block = make_block(**case[1])
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    arrays = oracle.global_tables(block.tables, seed=5)
    block.set_global_weights(arrays)
    first, second = block.tables[0].name, block.tables[-1].name
    a = rank_ids(block.tables[0].rows, seed=1)
    b = rank_ids(block.tables[0].rows, seed=2)[: 0 if comm.rank() == 0 else None]
    c = rank_ids(block.tables[-1].rows, seed=3)

    @tf.function
    def three(x, y, z):
        look = block.backend.lookup_table
        return look(first, x), look(first, y), look(second, z)

    for _ in range(2):  # the second call reuses the traced graph
        got = three(tf.constant(a), tf.constant(b, tf.int64), tf.constant(c))
        for out, table, ids in zip(got, (first, first, second), (a, b, c)):
            np.testing.assert_array_equal(out.numpy(), arrays[table][ids].reshape(-1, out.shape[1]))
