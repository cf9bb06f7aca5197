"""Custom-loop helpers: broadcast_variables skips local shards; mark_optimizer_slots."""

import numpy as np
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.merlin.training import (
    broadcast_variables,
    is_local,
    local_variables,
    mark_optimizer_slots,
)
from tests.ranks import oracle


def test_broadcast_variables_keeps_local_shards(hvd):
    block = DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        backend="horovod",
        sequence_combiner=oracle.COMBINERS,
        data_parallel_threshold=60,
    )
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    dense = tf.Variable(tf.fill([3], float(comm.rank() + 1)))
    local = local_variables(block)
    assert local and all(is_local(v) for v in local)
    dp = [v for v in block.trainable_variables if not is_local(v)]
    assert dp, "the data-parallel table is a global variable"
    for v in local + dp:
        v.assign(tf.fill(v.shape, float(comm.rank() + 1)))
    broadcast_variables([dense] + block.trainable_variables, root_rank=0)
    np.testing.assert_array_equal(dense.numpy(), [1.0, 1.0, 1.0])
    for v in dp:
        assert np.all(v.numpy() == 1.0)  # rank 0's copy everywhere
    for v in local:
        assert np.all(v.numpy() == comm.rank() + 1)  # untouched


def test_mark_optimizer_slots(hvd):
    block = DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        backend="horovod",
        sequence_combiner=oracle.COMBINERS,
    )
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    opt = tf.keras.optimizers.legacy.Adagrad(0.1)
    opt._create_all_weights(block.trainable_variables)
    mark_optimizer_slots(opt, block.trainable_variables)
    slots = [opt.get_slot(v, "accumulator") for v in local_variables(block)]
    assert slots and all(is_local(s) for s in slots)
