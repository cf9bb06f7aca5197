"""Whole-row statistics of column-sliced tables (rowwise/columns.py), in one process: a
slice's looked-up rows get their sums of squares by row id (duplicates summed first), only
with its block's anchor; a slice whose block's collective did not run is named."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.kernels.rowwise.columns import ColumnSums, column_sums, unique_rows
from merlin_models_de.variables import TableMark, mark_column_sync, mark_table


def _slice(first_col):
    var = tf.Variable(tf.zeros([5, 2]), name=f"item_cols_{first_col}")
    mark_table(var, TableMark("item", dim=4, cols=2, first_col=first_col))
    return var


def test_a_slices_rows_get_their_sums_of_squares_by_row_id():
    # one process holds one column slice of a table: its partials are the whole sums here
    # (across ranks the allgather adds the other holders'; tests/ranks/test_rowwise_adagrad.py)
    item, other = _slice(0), tf.Variable(tf.zeros([5, 2]), name="dense_like")
    anchor = tf.Variable(0.0, name="anchor")
    mark_column_sync(anchor, "mmde_block", ("item",), owner=0)
    grad = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 0.0], [1.0, 0.0]]),
                            tf.constant([4, 1, 4]))  # fmt: skip
    sums = column_sums([(grad, item), (tf.ones([5, 2]), other), (tf.constant(1.0), anchor)])
    ids, rows, total = sums.of(item)
    assert ids.numpy().tolist() == [4, 1]  # duplicates summed first, first seen first
    np.testing.assert_array_equal(rows.numpy(), [[2.0, 2.0], [3.0, 0.0]])
    assert total.numpy().tolist() == [8.0, 9.0]
    assert other.ref() not in sums.found  # not a table: no entry
    assert not column_sums([(grad, item)]).found  # without the anchor: no collective


def test_a_slice_without_its_blocks_collective_is_named():
    with pytest.raises(ValueError, match=r"table 'item'.*Received: variable='item_cols_0"):
        ColumnSums().of(_slice(0))


def test_unique_rows_of_dense_and_16_bit_gradients():
    var = tf.Variable(tf.zeros([3, 2], tf.float16))
    ids, rows = unique_rows(tf.ones([3, 2], tf.float16), var)
    assert ids.numpy().tolist() == [0, 1, 2] and rows.dtype == tf.float32
