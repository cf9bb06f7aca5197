"""Sparse table updates in pieces of at most 1,023 rows (merlin_models_de/scatter.py): the same
table as one scatter, the pieces really issued (sizes known and unknown when traced), one call
on a GPU, and the optimizers that use them (Keras' legacy SGD on table shards, RowWiseAdagrad)
against their references."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.merlin import hooks
from merlin_models_de.rowwise.adagrad import RowWiseAdagrad
from merlin_models_de.scatter import PIECE_ROWS, scatter_in_pieces
from merlin_models_de.variables import TableMark, mark_table
from tests.rowwise_reference import NumpyRowWiseAdagrad

ROWS, DIM = 50, 4


def ids_and_rows(n, seed=0):
    """``n`` ids with many repeats and integer rows: sums are exact in any order."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, ROWS, n).astype(np.int64), rng.integers(-3, 4, (n, DIM)).astype(
        np.float32
    )


def scatter_sizes(fn, *args):
    """The index counts of the scatter ops in ``fn``'s traced graph, in the order issued."""
    graph = fn.get_concrete_function(*args).graph
    return [
        op.inputs[1].shape[0]
        for op in graph.get_operations()
        if op.type.startswith("ResourceScatter")
    ]


def add(var):
    return lambda ids, rows: tf.raw_ops.ResourceScatterAdd(
        resource=var.handle, indices=ids, updates=rows
    )


@pytest.mark.parametrize("n", [PIECE_ROWS, PIECE_ROWS + 1, 2 * PIECE_ROWS + 5])
def test_pieces_add_what_one_scatter_adds(n):
    ids, rows = ids_and_rows(n)
    var, one = tf.Variable(tf.zeros([ROWS, DIM])), tf.Variable(tf.zeros([ROWS, DIM]))

    @tf.function
    def step(ids, rows):
        scatter_in_pieces(add(var), var.device, ids, rows)

    step(ids, rows)
    add(one)(ids, rows)
    np.testing.assert_array_equal(var.numpy(), one.numpy())
    expected = [PIECE_ROWS] * (n // PIECE_ROWS) + ([n % PIECE_ROWS] if n % PIECE_ROWS else [])
    assert scatter_sizes(step, ids, rows) == expected


def test_a_size_unknown_when_traced_loops_over_the_pieces():
    var, one = tf.Variable(tf.zeros([ROWS, DIM])), tf.Variable(tf.zeros([ROWS, DIM]))
    spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, DIM], tf.float32)]

    @tf.function(input_signature=spec)
    def step(ids, rows):
        scatter_in_pieces(add(var), var.device, ids, rows)

    for n in (0, 5, PIECE_ROWS, 3 * PIECE_ROWS + 1):
        ids, rows = ids_and_rows(n, seed=n)
        step(ids, rows)
        add(one)(ids, rows)
    np.testing.assert_array_equal(var.numpy(), one.numpy())
    graph = step.get_concrete_function().graph
    assert [op.type for op in graph.get_operations() if "While" in op.type] == ["While"]


def test_eager_calls_cut_the_same_way():
    ids, rows = ids_and_rows(2 * PIECE_ROWS + 1, seed=3)
    var, one = tf.Variable(tf.zeros([ROWS, DIM])), tf.Variable(tf.zeros([ROWS, DIM]))
    calls = []

    def counted(ids, rows):
        calls.append(int(ids.shape[0]))
        return add(var)(ids, rows)

    scatter_in_pieces(counted, var.device, tf.constant(ids), tf.constant(rows))
    add(one)(ids, rows)
    np.testing.assert_array_equal(var.numpy(), one.numpy())
    assert calls == [PIECE_ROWS, PIECE_ROWS, 1]


def test_a_variable_on_a_gpu_gets_one_call():
    calls = []
    ids, rows = ids_and_rows(3 * PIECE_ROWS)
    scatter_in_pieces(
        lambda i, r: calls.append(int(i.shape[0])),
        "/job:localhost/replica:0/task:0/device:GPU:0",
        tf.constant(ids),
        tf.constant(rows),
    )
    assert calls == [3 * PIECE_ROWS]


def marked(values, name="t"):
    var = tf.Variable(values, name=name)
    mark_table(var, TableMark(name, DIM, DIM))
    return var


def test_legacy_sgd_adds_a_table_shards_gradient_in_pieces():
    hooks.install()
    start = np.random.default_rng(1).normal(size=(ROWS, DIM)).astype(np.float32)
    table, plain = marked(start), tf.Variable(start)
    ids, rows = ids_and_rows(2 * PIECE_ROWS + 7, seed=4)
    grad = tf.IndexedSlices(tf.constant(rows), tf.constant(ids), tf.constant([ROWS, DIM]))
    opt_table = tf.keras.optimizers.legacy.SGD(0.25)
    opt_plain = tf.keras.optimizers.legacy.SGD(0.25)

    def stepper(opt, var):
        @tf.function
        def step():
            opt.apply_gradients([(grad, var)])

        return step

    step_table, step_plain = stepper(opt_table, table), stepper(opt_plain, plain)
    step_table()
    step_plain()
    expected = start.astype(np.float64)
    np.add.at(expected, ids, -0.25 * rows.astype(np.float64))
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(plain.numpy(), expected, rtol=1e-6, atol=1e-5)
    assert scatter_sizes(step_table) == [PIECE_ROWS, PIECE_ROWS, 7]
    assert scatter_sizes(step_plain) == [2 * PIECE_ROWS + 7]  # not a table: as Keras has it


def test_row_wise_adagrad_updates_many_rows_in_pieces_as_the_reference():
    rows_total = 3000
    start = np.random.default_rng(2).normal(size=(rows_total, DIM)).astype(np.float32)
    var = marked(start)
    ref_var, ref = tf.Variable(start), NumpyRowWiseAdagrad(0.3, 0.1, 1e-7)
    opt = RowWiseAdagrad(0.3, initial_accumulator_value=0.1, epsilon=1e-7)

    @tf.function
    def apply(grad):
        opt.apply_gradients([(grad, var)])

    rng = np.random.default_rng(5)
    for _ in range(2):
        ids = rng.integers(0, rows_total, 2500).astype(np.int64)  # > 2 pieces after dedup
        grad = tf.IndexedSlices(
            tf.constant(rng.normal(size=(2500, DIM)).astype(np.float32)),
            tf.constant(ids),
            tf.constant([rows_total, DIM], tf.int64),
        )
        apply(grad)
        ref.apply_gradients([(grad, ref_var)])
    np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6)
