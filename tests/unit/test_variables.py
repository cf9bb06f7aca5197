"""Model queries (variables.py), in one process: the slots of new and legacy Keras optimizers
found by variable, local slots marked like their variables, dense weights apart from tables."""

import pytest
import tensorflow as tf

from merlin_models_de.variables import (
    TableMark,
    dense_weights,
    is_local,
    mark_local,
    mark_optimizer_slots,
    mark_table,
    optimizer_parts,
    slot_names,
    slots_of,
    table_mark,
)

OPTIMIZERS = {
    "adam": lambda: tf.keras.optimizers.Adam(0.1),
    "legacy adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.1),
}


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_slots_are_found_by_variable_and_local_ones_marked(make):
    table, dense = tf.Variable(tf.ones([4, 2]), name="table"), tf.Variable(1.0, name="dense")
    mark_local(table)
    optimizer = make()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(table) * dense
    optimizer.apply_gradients(zip(tape.gradient(loss, [table, dense]), [table, dense]))
    names = slot_names(optimizer)
    assert names in (["m", "v"], ["accumulator"])
    assert set(slots_of(optimizer, table)) == set(names)
    assert all(s.shape == (4, 2) for s in slots_of(optimizer, table).values())
    mark_optimizer_slots(optimizer, [table, dense])
    assert all(is_local(s) for s in slots_of(optimizer, table).values())
    assert not any(is_local(s) for s in slots_of(optimizer, dense).values())


def test_table_marks_and_containers():
    var = tf.Variable(tf.zeros([3, 2]))
    assert table_mark(var) is None
    mark_table(var, TableMark("item", dim=8, cols=2, first_col=4))
    assert table_mark(var).column_sliced and table_mark(var).first_col == 4
    assert optimizer_parts(None) == []
    inner = tf.keras.optimizers.SGD()
    scaled = tf.keras.mixed_precision.LossScaleOptimizer(inner)
    assert optimizer_parts(scaled)[-1] is inner and optimizer_parts(scaled)[0] is scaled


def test_dense_weights_leave_the_blocks_out():
    inputs = tf.keras.Input([3])
    first = tf.keras.layers.Dense(2, name="first")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="second")(first(inputs)))
    assert [w.name for w in dense_weights(model, blocks=[first])] == [
        w.name for w in model.get_layer("second").weights
    ]
