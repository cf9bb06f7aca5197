"""Stochastic rounding to 16-bit tables (rounding.py), in one process: exact values stay,
others go to one of their two neighbours with the right odds, and the random bits depend on the
element, the step and the table only."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.kernels.rounding import is_narrow, random_bits, stochastic_round, widened


def _bits(n, step=0, table="t"):
    return random_bits(tf.range(n, dtype=tf.int64), 0, 1, 1, step, table)[:, 0]


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_rounding_is_unbiased_between_the_two_neighbours(dtype):
    low = tf.cast(tf.constant(1.0, dtype), tf.float32)
    n = 20000
    x = tf.fill([n], 1.0 + 0.25 * (2.0**-10 if dtype == tf.float16 else 2.0**-7))
    out = tf.cast(stochastic_round(x, dtype, _bits(n)), tf.float32).numpy()
    upper = out[out != low.numpy()]
    assert len(set(upper.tolist())) == 1 and upper[0] > x[0]  # only the two neighbours
    assert abs(len(upper) / n - 0.25) < 0.02  # a quarter of the way up: a quarter go up
    exact = tf.constant([0.0, -2.5, 1.0, 3.0])  # held exactly: never moved
    kept = stochastic_round(exact, dtype, _bits(4))
    assert tf.cast(kept, tf.float32).numpy().tolist() == [0.0, -2.5, 1.0, 3.0]


def test_random_bits_depend_on_element_step_and_table_only():
    a = random_bits(tf.constant([3, 7], tf.int64), 2, 4, 8, 5, "item").numpy()
    again = random_bits(tf.constant([7, 3], tf.int64), 2, 4, 8, 5, "item").numpy()
    np.testing.assert_array_equal(a, again[::-1])  # the same cells, in any order
    assert (a >= 0).all() and (a < 2**32).all() and len(np.unique(a)) == 8
    assert (a != random_bits(tf.constant([3, 7], tf.int64), 2, 4, 8, 6, "item").numpy()).all()
    assert (a != random_bits(tf.constant([3, 7], tf.int64), 2, 4, 8, 5, "user").numpy()).any()


def test_16_bit_values_are_widened_to_float32():
    assert is_narrow(tf.float16) and is_narrow("bfloat16") and not is_narrow(tf.float32)
    assert widened(tf.constant([1.0], tf.float16)).dtype == tf.float32
    sliced = widened(tf.IndexedSlices(tf.ones([1, 2], tf.bfloat16), tf.constant([4])))
    assert sliced.values.dtype == tf.float32 and sliced.indices.numpy().tolist() == [4]
