"""The merged backward's pieces that one process can check (the 2-rank oracles in
tests/ranks/test_oracle.py and test_fit.py check the round itself)."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.backends.horovod import backward, wire
from merlin_models_de.backends.step import complete_waiting, training_step


@pytest.mark.parametrize(
    "dtype, unit",
    [
        (tf.float32, tf.uint16),
        (tf.bfloat16, tf.uint16),
        (tf.float16, tf.uint16),
        (tf.float32, tf.float32),
    ],
)
def test_values_travel_as_units_bit_for_bit(dtype, unit):
    x = tf.cast(tf.constant([[1.5, -2.25e-3], [np.pi, 65504.0]]), dtype)
    units = wire.units(x, unit)
    assert units.dtype == unit and units.shape == [4 * dtype.size // unit.size]
    back = wire.from_units(units, dtype)
    np.testing.assert_array_equal(
        tf.bitcast(back, tf.uint16 if dtype.size == 2 else tf.uint32),
        tf.reshape(tf.bitcast(x, tf.uint16 if dtype.size == 2 else tf.uint32), [-1]),
    )


def test_the_dense_part_joins_while_its_extra_bytes_stay_small():
    assert backward.extra_bytes(2, 10**9) == 0  # 2 ranks: a ring allreduce's bytes
    assert backward.extra_bytes(8, 8 << 20) == pytest.approx(7 * (8 << 20) * (1 - 2 / 8))
    assert backward.extra_bytes(4, 1 << 20) < backward.MAX_EXTRA_BYTES


def test_sums_of_gradients_keep_sparse_ones_sparse():
    a = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 4]), tf.constant([5, 3]))
    b = tf.IndexedSlices(2 * tf.ones([1, 3]), tf.constant([4]), tf.constant([5, 3]))
    both = backward._added(a, b)
    assert isinstance(both, tf.IndexedSlices)
    dense = tf.convert_to_tensor(both).numpy()
    np.testing.assert_array_equal(dense[:, 0], [1, 0, 0, 0, 3])
    mixed = backward._added(tf.ones([5, 3]), b)
    np.testing.assert_array_equal(mixed.numpy()[:, 0], [1, 1, 1, 1, 3])
    assert backward._added(None, b) is b


def test_one_process_exchanges_at_once_and_completes_nothing():
    """One rank: nothing is recorded or kept; the optimizer's gradients pass unchanged."""
    table = tf.Variable(tf.ones([4, 2]))
    with tf.GradientTape() as tape:
        with backward.recording([table], enabled=True) as recorded:
            rows = tf.gather(table, [1, 3])
        assert recorded is None
        with training_step({}):
            (received,), arrived = backward.exchange(
                [[tf.reshape(rows, [-1])]],
                [tf.constant([4])],
                [tf.constant([4])],
                "v",
                recorded,
                waiting=[],
            )
            assert arrived is None
            (received,) = received
            loss = tf.reduce_sum(received * 3.0)
            (grad,) = tape.gradient(loss, [table])
            grads, averaged = complete_waiting([grad], [table], [True])
    assert averaged == [False] and grads[0] is grad
    np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy()[:, 0], [0, 3, 0, 3])
