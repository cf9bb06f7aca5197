"""A dynamic table's new row starts with each optimizer slot at its initial value
(merlin_models_de/dynamic/reset.py)."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import RowWiseAdagrad
from merlin_models_de.dynamic.keys import initial_rows
from merlin_models_de.dynamic.reset import optimizer_state, row_reset
from merlin_models_de.variables import TableMark, mark_table

LEGACY = tf.keras.optimizers.legacy


def trained_table(optimizer):
    """A 6x4 table that took two sparse steps on every row: its state is far from fresh."""
    var = tf.Variable(tf.ones([6, 4]), name="table")
    mark_table(var, TableMark("item", 4, 4, True, 0, 0, 0))  # RowWiseAdagrad: a row slot
    for _ in range(2):
        grad = tf.IndexedSlices(tf.fill([6, 4], 3.0), tf.range(6), tf.constant([6, 4]))
        optimizer.apply_gradients([(grad, var)])
    return var


@pytest.mark.parametrize(
    "make, fresh",
    [
        (lambda: LEGACY.Adagrad(0.1, initial_accumulator_value=0.25), {"accumulator": 0.25}),
        (lambda: LEGACY.Adam(0.1), {"m": 0.0, "v": 0.0}),
        (lambda: LEGACY.SGD(0.1, momentum=0.9), {"momentum": 0.0}),
        (lambda: RowWiseAdagrad(0.1, initial_accumulator_value=0.5), {"row_accumulator": 0.5}),
        (lambda: LEGACY.SGD(0.1), {}),
    ],
)
def test_rows_given_to_new_keys_start_afresh_and_the_others_keep_their_state(make, fresh):
    optimizer = make()
    var = trained_table(optimizer)
    before = {n: optimizer.get_slot(var, n).numpy().copy() for n in fresh}
    init = tf.keras.initializers.RandomUniform(-0.1, 0.1)
    keys = tf.constant([10**12, 77], tf.int64)
    row_reset(var, init, "item", optimizer_state(optimizer))(tf.constant([1, 4], tf.int64), keys)
    expected_rows = initial_rows(init, keys, 4, "item", tf.float32).numpy()
    np.testing.assert_array_equal(var.numpy()[[1, 4]], expected_rows)
    assert np.all(var.numpy()[[0, 2, 3, 5]] != 1.0)  # trained, untouched
    for name, value in fresh.items():
        slot = optimizer.get_slot(var, name).numpy()
        np.testing.assert_array_equal(slot[[1, 4]], np.full_like(slot[[1, 4]], value))
        np.testing.assert_array_equal(slot[[0, 2, 3, 5]], before[name][[0, 2, 3, 5]])
        assert not np.allclose(before[name][[1, 4]], value)  # it was not fresh before


def test_a_slot_without_a_known_initial_value_is_refused_naming_it():
    class Odd(LEGACY.SGD):
        def _create_slots(self, var_list):
            for var in var_list:
                self.add_slot(var, "odd")

    var = tf.Variable(tf.ones([3, 2]))
    state = optimizer_state(Odd(0.1))
    with pytest.raises(NotImplementedError, match="Odd's slot 'odd'"):
        state(var)


def test_a_new_style_keras_optimizer_is_refused_naming_it():
    var = tf.Variable(tf.ones([3, 2]))
    with pytest.raises(
        NotImplementedError, match="legacy Keras optimizer.*Received: optimizer=Adam"
    ):
        optimizer_state(tf.keras.optimizers.Adam(0.1))(var)
