"""Sparse table updates (merlin_models_de/scatter.py). Adds in pieces of at most 1,023 rows: the
same table as one scatter, the pieces really issued (sizes known and unknown when traced), one
call on a GPU, and Keras' legacy SGD on table shards against its reference. Adagrad's rows
gathered and written back: the floats of TF's fused kernel, through Keras' legacy Adagrad on
CPU table shards only, and RowWiseAdagrad's on many rows against its reference."""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.kernels.rowwise.adagrad import RowWiseAdagrad
from merlin_models_de.kernels.scatter import PIECE_ROWS, adagrad_rows, scatter_in_pieces
from merlin_models_de.merlin import hooks
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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_wise_adagrad_updates_many_rows_as_the_reference(dtype):
    rows_total = 3000
    start = np.random.default_rng(2).normal(size=(rows_total, DIM)).astype(dtype)
    var = marked(start)
    ref_var, ref = tf.Variable(start), NumpyRowWiseAdagrad(0.3, 0.1, 1e-7)
    opt = RowWiseAdagrad(0.3, initial_accumulator_value=0.1, epsilon=1e-7)

    @tf.function
    def apply(grad):
        opt.apply_gradients([(grad, var)])

    rng = np.random.default_rng(5)
    for _ in range(2):
        ids = rng.integers(0, rows_total, 2500).astype(np.int64)  # many rows, many repeats
        grad = tf.IndexedSlices(
            tf.constant(rng.normal(size=(2500, DIM)).astype(dtype)),
            tf.constant(ids),
            tf.constant([rows_total, DIM], tf.int64),
        )
        apply(grad)
        ref.apply_gradients([(grad, ref_var)])
    np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6)
    # written back: no adding scatter, no loop over pieces
    types = op_types(apply, grad)
    assert "ResourceScatterUpdate" in types
    assert not {"ResourceScatterAdd", "While", "StatelessWhile"} & set(types)


def op_types(fn, *args):
    return [op.type for op in fn.get_concrete_function(*args).graph.get_operations()]


def test_adagrad_rows_are_the_floats_of_tfs_fused_kernel():
    rng = np.random.default_rng(6)
    start = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    accumulated = rng.uniform(0.05, 2.0, (ROWS, DIM)).astype(np.float32)
    var, acc = tf.Variable(start), tf.Variable(accumulated)
    fused_var, fused_acc = tf.Variable(start), tf.Variable(accumulated)
    lr, eps = tf.constant(0.37), tf.constant(1e-3)

    @tf.function
    def composed(ids, grad):
        adagrad_rows(var, acc, ids, grad, lr, eps)

    for _ in range(3):
        ids = rng.permutation(ROWS)[:30].astype(np.int64)  # unique, as Keras gives them
        grad = (rng.normal(size=(30, DIM)) * 10 ** rng.uniform(-4, 2, (30, 1))).astype(np.float32)
        composed(ids, grad)
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=fused_var.handle,
            accum=fused_acc.handle,
            lr=lr,
            epsilon=eps,
            grad=grad,
            indices=ids,
        )
        np.testing.assert_array_equal(acc.numpy(), fused_acc.numpy())
        np.testing.assert_array_equal(var.numpy(), fused_var.numpy())
    assert "ResourceSparseApplyAdagradV2" not in op_types(composed, ids, grad)


def test_adagrad_on_a_gpu_keeps_keras_fused_kernel():
    table = marked(np.zeros([ROWS, DIM], np.float32), name="cpu")
    # no GPU here: a table's stand-in under a GPU's device name
    on_gpu = SimpleNamespace(device="/job:localhost/replica:0/task:0/device:GPU:0")
    mark_table(on_gpu, TableMark("gpu", DIM, DIM))
    assert hooks.is_cpu_table_shard(table)
    assert not hooks.is_cpu_table_shard(on_gpu)
    assert not hooks.is_cpu_table_shard(tf.Variable(tf.zeros([ROWS, DIM])))  # not a table


def test_legacy_adagrad_updates_a_table_shards_rows_by_gather_and_write():
    hooks.install()
    rng = np.random.default_rng(7)
    start = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    table, plain = marked(start, name="ada"), tf.Variable(start)
    ids, rows = ids_and_rows(300, seed=8)  # many repeats: Keras sums them first
    grad = tf.IndexedSlices(tf.constant(rows), tf.constant(ids), tf.constant([ROWS, DIM]))

    def stepper(var):
        opt = tf.keras.optimizers.legacy.Adagrad(0.2, initial_accumulator_value=0.1)

        @tf.function
        def step():
            opt.apply_gradients([(grad, var)])

        return step

    step_table, step_plain = stepper(table), stepper(plain)
    for _ in range(2):
        step_table()
        step_plain()
    np.testing.assert_array_equal(table.numpy(), plain.numpy())
    assert not np.array_equal(table.numpy(), start)
    assert "ResourceSparseApplyAdagradV2" not in op_types(step_table)
    assert "ResourceSparseApplyAdagradV2" in op_types(step_plain)  # not a table: as Keras has it
