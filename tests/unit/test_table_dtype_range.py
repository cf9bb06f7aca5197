"""16-bit tables at the edge of their range, in one process: gradients reach the update in
float32 (a float16 gradient element above 65504 would be inf), and an update that would store
a value the table's dtype cannot hold fails the step naming the table, writing nothing."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, RowWiseAdagrad
from merlin_models_de.kernels.rowwise.adagrad import ROW_SLOT
from merlin_models_de.variables import TableMark, mark_table
from tests.unit.test_layer_arguments import schema
from tests.unit.test_table_dtype import data


class Ranker(tf.keras.Model):
    """The block's rows, concatenated, into one Dense unit."""

    def __init__(self, table_dtype, **options):
        super().__init__()
        self.embeddings = DistributedEmbeddings(schema(), dim=4, table_dtype=table_dtype, **options)
        self.head = tf.keras.layers.Dense(1)

    def call(self, features):
        rows = self.embeddings(features)
        return self.head(tf.concat([rows[name] for name in sorted(rows)], axis=1))


def one_step_far_from_the_target(table_dtype, **options):
    """The block's tables (as float32) after one step of MSE against 1e6, batch 8."""
    tf.keras.utils.set_random_seed(2)
    m = Ranker(table_dtype, **options)
    m.compile(optimizer=RowWiseAdagrad(0.05), loss="mse")
    x, _ = data(8)
    m.fit(x, np.full((8, 1), 1e6, np.float32), batch_size=8, epochs=1, verbose=0)
    tables = [w for w in m.embeddings.trainable_weights if w.shape.rank == 2]
    assert tables and {w.dtype for w in tables} == {tf.as_dtype(table_dtype or "float32")}
    return [np.asarray(w, np.float32) for w in tables]


def test_float16_tables_train_on_gradients_beyond_float16():
    """The loss's gradient reaches ~1e6 per element: in float16 that was inf and every row
    looked up turned NaN; kept in float32 to the update, the rows move as float32 tables'
    do, within float16's rounding."""
    wide = one_step_far_from_the_target(None)
    narrow = one_step_far_from_the_target("float16")
    for w, n in zip(wide, narrow):
        assert np.isfinite(n).all()
        np.testing.assert_allclose(n, w, rtol=2e-3, atol=1e-3)
    # a regularizer's gradient (dense) joins the lookups' (sparse) on the same 16-bit table
    regularized = one_step_far_from_the_target("float16", embeddings_regularizer="l2")
    assert all(np.isfinite(n).all() for n in regularized)


def table(value, dtype="float16"):
    var = tf.Variable(tf.fill([6, 4], tf.cast(value, dtype)))
    mark_table(var, TableMark("items", 4, 4))
    return var


@pytest.mark.parametrize("graph", [False, True])
def test_an_update_beyond_the_dtype_fails_naming_the_table(graph):
    """60000 + ~9500 is above float16's 65504 (rounding would store inf, then NaN): the step
    fails naming the table and writes nothing; sparse and dense gradients alike."""
    var = table(60000.0)
    opt = RowWiseAdagrad(10_000.0)
    grads = [
        tf.IndexedSlices(tf.fill([2, 4], -1.0), tf.constant([1, 3]), tf.constant([6, 4])),
        tf.fill([6, 4], -1.0),
    ]
    apply = tf.function(lambda pairs: opt.apply_gradients(pairs) and None)
    apply = apply if graph else opt.apply_gradients
    for grad in grads:
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"(?s)Table \\?'items\\?' is stored in float16 \(table_dtype\), whose largest value "
            r"is 65504.*Largest \|value\| of its new rows:",
        ):
            apply([(grad, var)])
        assert (np.asarray(var, np.float32) == 60000.0).all()  # nothing written
        np.testing.assert_array_equal(opt.get_slot(var, ROW_SLOT).numpy(), 0.1)
    # within range it trains; NaN gradients are refused the same way
    small = table(1.0)
    opt.apply_gradients([(tf.fill([6, 4], -1.0), small)])
    assert np.isfinite(np.asarray(small, np.float32)).all()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Table \\?'items"):
        opt.apply_gradients([(tf.fill([6, 4], float("nan")), small)])
