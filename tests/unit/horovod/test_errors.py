"""Bad input on one rank fails every rank with a clear error, and nobody hangs."""
import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from tests.unit.horovod import oracle


def make_block():
    return DistributedEmbeddings(oracle.mixed_schema(), dim=oracle.DIMS, backend="horovod",
                                 sequence_combiner=oracle.COMBINERS, strategy="memory_balanced",
                                 column_slice_threshold=4000)


def inputs_for(block, size, seed=0):
    return oracle.select(oracle.global_batch(block.features, block.tables, size, seed), 0, size)


def still_in_step():
    """A collective after the error: proves the ranks did not drift apart or hang."""
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()


def test_different_batch_sizes_across_ranks_fail_on_every_rank(hvd):
    block = make_block()
    block(inputs_for(block, 8))
    size = 8 if comm.rank() == 0 else 6
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"(?s)Every rank must feed the same per-rank batch size.*8, 6"):
        block(inputs_for(block, size))
    still_in_step()


def test_bad_id_on_one_rank_names_it_there_and_fails_the_others(hvd):
    block = make_block()
    good = inputs_for(block, 8)
    block(good)
    bad = dict(good)
    if comm.rank() == 1:
        bad["item"] = tf.constant([[1], [2], [3], [1000], [4], [5], [6], [7]], tf.int64)
        message = r"(?s)An id is outside its table. Received: feature=.*item.*id=.*1000.*rows=.*1000"
    else:
        message = r"(?s)Invalid input on another rank \(this is rank 0\).*0, 1"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        block(bad)
    still_in_step()
    out = block(good)  # and the block works again afterwards
    assert out["item"].shape == (8, 8)


def test_uneven_last_batch_in_graph_mode(hvd):
    block = make_block()
    step = tf.function(lambda x: block(x))
    step(inputs_for(block, 8))
    size = 8 if comm.rank() == 0 else 5
    with pytest.raises(tf.errors.InvalidArgumentError, match="same per-rank batch size"):
        step(inputs_for(block, size))
    still_in_step()
