"""The exchange (backends/horovod/exchange.py) in one process: a rank's row slice answers the
ids it holds rows for and zeros for the others, pooled, one row per id, or one-hot; and how an
asker combines the answers of several ranks. (Across 2 ranks: tests/ranks/test_table_lookup.py
and test_oracle.py.)"""

import numpy as np
import tensorflow as tf

from merlin_models_de.backends.horovod.exchange import _combined, row_sliced_lookup
from merlin_models_de.planner.types import Shard, ShardingType

TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)  # row r holds 4r .. 4r + 3
SHARD = Shard("t", 0, ShardingType.ROW_WISE, 4, 4, 0, 4)  # rows 4..7 live here
SLICE = tf.Variable(TABLE[4:8])


def _rows(ids):
    return np.stack([TABLE[i] if 4 <= i < 8 else np.zeros(4, np.float32) for i in ids])


def test_one_hot_ids_read_their_rows_here_and_zeros_elsewhere():
    ids = tf.constant([5, 1, 7, 9], tf.int64)
    out = row_sliced_lookup(SLICE, SHARD, ids, "mmde_t_rw")
    np.testing.assert_array_equal(out.numpy(), _rows([5, 1, 7, 9]))


def test_multi_hot_ids_pool_the_rows_held_here():
    ids, lengths = tf.constant([4, 5, 2, 6], tf.int64), tf.constant([2, 0, 2], tf.int64)
    out = row_sliced_lookup(SLICE, SHARD, ids, "mmde_t_rw", lengths=lengths, combiner="sum")
    expected = [_rows([4, 5]).sum(0), np.zeros(4), _rows([2, 6]).sum(0)]
    np.testing.assert_array_equal(out.numpy(), np.stack(expected))


def test_unpooled_ids_come_back_one_row_each():
    ids, lengths = tf.constant([4, 9, 6], tf.int64), tf.constant([1, 2], tf.int64)
    out = row_sliced_lookup(SLICE, SHARD, ids, "mmde_t_rw", lengths=lengths)
    np.testing.assert_array_equal(out.numpy(), _rows([4, 9, 6]))


def test_gradients_reach_only_the_rows_read():
    ids = tf.constant([5, 5, 1], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(row_sliced_lookup(SLICE, SHARD, ids, "mmde_t_rw"))
    grad = tf.convert_to_tensor(tape.gradient(loss, SLICE)).numpy()
    np.testing.assert_array_equal(grad.sum(1), [0, 8, 0, 0])  # row 5 read twice, 4 columns


def test_answers_of_the_same_columns_sum_and_column_groups_join_in_column_order():
    """What an asker with 2 ids receives from 3 ranks: rank 0 answers columns 2..3, rank 2
    columns 0..1; rank 1 owns no slice and sent nothing."""
    count = tf.constant(2, tf.int32)
    high, low = np.array([[1, 2], [3, 4]], np.float32), np.array([[5, 6], [7, 8]], np.float32)
    received = tf.constant(np.concatenate([high.ravel(), low.ravel()]))
    joined = _combined(received, count, {0: (2, 2), 2: (0, 2)}, 3)
    np.testing.assert_array_equal(joined.numpy(), np.concatenate([low, high], axis=1))
    # row slices: every owner answers every column, its rows and zeros elsewhere
    summed = _combined(received, count, {0: (0, 2), 2: (0, 2)}, 3)
    np.testing.assert_array_equal(summed.numpy(), high + low)
    nothing = _combined(tf.zeros([0]), tf.constant(0), {0: (2, 2), 2: (0, 2)}, 3)
    assert nothing.shape == (0, 4)
