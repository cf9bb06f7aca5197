"""RowWiseAdagrad on plain variables against the NumPy reference (tests/rowwise_reference.py):
sparse gradients with duplicate ids, dense gradients, element-wise Adagrad for non-tables,
eager and graph, and its configuration."""

import numpy as np
import pytest
import tensorflow as tf

import merlin_models_de
from merlin_models_de.kernels.rowwise.adagrad import ROW_SLOT, RowWiseAdagrad
from merlin_models_de.merlin.optimizers import scaled_optimizer
from merlin_models_de.variables import TableMark, mark_table, slots_of
from tests.rowwise_reference import NumpyRowWiseAdagrad

LR, INITIAL, EPS = 0.3, 0.1, 1e-7


def table(rows=7, dim=5, seed=0, name="t"):
    rng = np.random.default_rng(seed)
    var = tf.Variable(rng.normal(size=(rows, dim)).astype(np.float32), name=name)
    mark_table(var, TableMark(name, dim, dim))
    return var


def sparse_grad(ids, dim, seed, rows=7):
    values = np.random.default_rng(seed).normal(size=(len(ids), dim)).astype(np.float32)
    return tf.IndexedSlices(
        tf.constant(values), tf.constant(ids, tf.int64), tf.constant([rows, dim], tf.int64)
    )


def reference(var):
    return NumpyRowWiseAdagrad(LR, INITIAL, EPS, is_table=lambda v: v.shape.rank == 2)


def copy(var):
    return tf.Variable(var.numpy())


def test_exported_from_the_package():
    assert merlin_models_de.RowWiseAdagrad is RowWiseAdagrad
    assert "RowWiseAdagrad" in merlin_models_de.__all__


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_sparse_gradients_with_duplicate_ids_match_the_reference(graph):
    var = table()
    ref_var, ref = copy(var), reference(var)
    opt = RowWiseAdagrad(LR, initial_accumulator_value=INITIAL, epsilon=EPS)

    def apply(grads_and_vars):
        opt.apply_gradients(grads_and_vars)

    apply = tf.function(apply) if graph else apply
    steps = [[1, 3, 1, 1, 6], [3, 0, 3], [6, 6, 2, 5]]  # duplicates within a step
    for k, ids in enumerate(steps):
        grad = sparse_grad(ids, 5, seed=k)
        apply([(grad, var)])
        ref.apply_gradients([(grad, ref_var)])
    np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6)
    acc = slots_of(opt, var)[ROW_SLOT]
    assert acc.shape == (7, 1)
    np.testing.assert_allclose(acc.numpy(), ref.accumulator(ref_var), rtol=1e-5)
    assert acc.numpy()[4, 0] == pytest.approx(INITIAL)  # never looked up: untouched
    # the reference's duplicates are summed before squaring: squaring each occurrence differs
    g = sparse_grad(steps[0], 5, seed=0)
    summed_first = np.mean(np.asarray(g.values[0] + g.values[2] + g.values[3]) ** 2)
    squared_each = sum(np.mean(np.asarray(g.values[i]) ** 2) for i in (0, 2, 3))
    assert abs(summed_first - squared_each) > 1e-3


def test_dense_gradient_of_a_table_is_the_same_update():
    var, other = table(seed=1), table(seed=1)
    ref_var, ref = copy(var), reference(var)
    opt = RowWiseAdagrad(LR, initial_accumulator_value=INITIAL, epsilon=EPS)
    for k, ids in enumerate([[0, 2, 2], [4, 0]]):
        grad = sparse_grad(ids, 5, seed=10 + k)
        opt.apply_gradients([(grad, var), (tf.convert_to_tensor(grad), other)])
        ref.apply_gradients([(grad, ref_var)])
    np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(other.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6)


def test_non_tables_get_element_wise_adagrad():
    rng = np.random.default_rng(3)
    kernel = tf.Variable(rng.normal(size=(4, 3)).astype(np.float32))  # 2-D, not a table
    bias = tf.Variable(rng.normal(size=(3,)).astype(np.float32))
    keras = [copy(kernel), copy(bias)]
    ref_vars = [copy(kernel), copy(bias)]
    ref = NumpyRowWiseAdagrad(LR, INITIAL, EPS, is_table=lambda v: False)
    opt = RowWiseAdagrad(LR, initial_accumulator_value=INITIAL, epsilon=EPS)
    adagrad = tf.keras.optimizers.legacy.Adagrad(LR, initial_accumulator_value=INITIAL, epsilon=EPS)
    for _ in range(3):
        grads = [tf.constant(rng.normal(size=v.shape), tf.float32) for v in ref_vars]
        opt.apply_gradients(zip(grads, [kernel, bias]))
        adagrad.apply_gradients(zip(grads, keras))
        ref.apply_gradients(zip(grads, ref_vars))
    for got, want, k in zip([kernel, bias], ref_vars, keras):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.numpy(), k.numpy(), rtol=1e-6, atol=1e-7)
    assert slots_of(opt, kernel)["accumulator"].shape == kernel.shape


def test_row_wise_differs_from_element_wise():
    """The reference tells the two apart on this data (the tests above can fail)."""
    var, flat = table(seed=4), table(seed=4)
    RowWiseAdagrad(LR).apply_gradients([(sparse_grad([0, 1], 5, 4), var)])
    tf.keras.optimizers.legacy.Adagrad(LR).apply_gradients([(sparse_grad([0, 1], 5, 4), flat)])
    assert not np.allclose(var.numpy()[:2], flat.numpy()[:2], rtol=1e-3)


def test_config_round_trip_and_scaled_learning_rate():
    opt = RowWiseAdagrad(0.2, initial_accumulator_value=0.5, epsilon=1e-6)
    again = RowWiseAdagrad.from_config(opt.get_config())
    assert again.get_config() == opt.get_config()
    scaled = scaled_optimizer(opt, 2)
    assert type(scaled) is RowWiseAdagrad
    assert float(scaled.learning_rate) == pytest.approx(0.4)
    assert scaled.get_config()["initial_accumulator_value"] == 0.5


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(initial_accumulator_value=-1.0), "initial_accumulator_value=-1.0"),
        (dict(epsilon=0.0), "epsilon=0.0"),
    ],
)
def test_bad_hyper_parameters_are_refused(kwargs, named):
    with pytest.raises(ValueError, match=named):
        RowWiseAdagrad(0.1, **kwargs)


def test_a_variable_holding_several_shards_is_refused():
    var = tf.Variable(tf.zeros([6, 4]))
    mark_table(var, TableMark("merged_table", 4, 4, whole=False))
    with pytest.raises(ValueError, match="merged_table"):
        RowWiseAdagrad(0.1).apply_gradients([(tf.ones([6, 4]), var)])


def test_a_column_slice_without_its_blocks_collective_is_named():
    var = tf.Variable(tf.zeros([6, 2]))
    mark_table(var, TableMark("sliced_table", 4, 2))  # 2 of the table's 4 columns
    with pytest.raises(ValueError, match="column-sliced table 'sliced_table'"):
        RowWiseAdagrad(0.1).apply_gradients([(tf.ones([6, 2]), var)])
