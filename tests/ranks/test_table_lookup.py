"""Table lookups of arbitrary ids (different counts per rank) for every sharding kind:
equal to indexing the full table, differentiable on the single-process scale, and bad ids
fail every rank."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.merlin.training import DistributedGradientTape
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
    # gradient: sum over every rank's looked-up rows of (row . 1); one process would add
    # the count of each id over all ranks; as a mean over N ranks' losses, each table row's
    # gradient is that count / N... times N after Horovod's scaling of local gradients
    table = "user"
    ids = rank_ids(2000, seed=9)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(block.backend.lookup_table(table, tf.constant(ids)))
    tape = DistributedGradientTape(tape, block)
    variables = block.trainable_variables
    grads = tape.gradient(loss, variables)
    all_ids = np.concatenate(comm.allgather_object(ids.tolist()))
    want = np.zeros((2000, 8), np.float32)
    np.add.at(want, all_ids, 1.0 / comm.size())
    got = np.zeros((2000, 8), np.float32)
    for var, grad in zip(variables, grads):
        shard = next(
            (
                s
                for s in block.plan.shards_on(comm.rank())
                if s.table == table and block.backend.shard_variable(s)[0] is var
            ),
            None,
        )
        if shard is None or grad is None:
            continue
        dense = tf.convert_to_tensor(grad).numpy()
        got[
            shard.row_start : shard.row_start + shard.rows,
            shard.col_start : shard.col_start + shard.cols,
        ] = dense
    mine = [s for s in block.plan.shards_on(comm.rank()) if s.table == table]
    for s in mine:
        np.testing.assert_allclose(
            got[s.row_start : s.row_start + s.rows, s.col_start : s.col_start + s.cols],
            want[s.row_start : s.row_start + s.rows, s.col_start : s.col_start + s.cols],
            rtol=1e-6,
            atol=1e-7,
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
