"""A key's owner and its new row depend on the key alone (merlin_models_de/dynamic/keys.py)."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.dynamic.keys import initial_rows, owner_of

KEYS = tf.constant([0, 1, 2, -7, 2**62 + 3, 10**12, 10**12 + 1] + list(range(100, 1100)), tf.int64)


def test_owners_spread_evenly_and_do_not_depend_on_the_batch():
    owners = owner_of(KEYS, 4).numpy()
    assert set(owners) == {0, 1, 2, 3}
    assert np.bincount(owners).min() > 0.2 * len(owners)  # about a quarter each
    reordered = owner_of(tf.reverse(KEYS, [0]), 4).numpy()[::-1]
    np.testing.assert_array_equal(owners, reordered)
    assert set(owner_of(KEYS, 1).numpy()) == {0}


def test_a_keys_row_is_the_same_whatever_batch_draws_it():
    init = tf.keras.initializers.RandomUniform(-0.1, 0.1)
    whole = initial_rows(init, KEYS, 8, "item", tf.float32).numpy()
    alone = initial_rows(init, KEYS[4:5], 8, "item", tf.float32).numpy()
    np.testing.assert_array_equal(whole[4:5], alone)
    assert whole.min() >= -0.1 and whole.max() < 0.1
    assert abs(whole.mean()) < 0.01 and whole.std() > 0.05  # spread over the range
    other_table = initial_rows(init, KEYS[4:5], 8, "user", tf.float32).numpy()
    assert not np.array_equal(alone, other_table)


@pytest.mark.parametrize(
    "init, mean, std",
    [
        (tf.keras.initializers.RandomNormal(0.5, 0.2), 0.5, 0.2),
        (tf.keras.initializers.TruncatedNormal(0.0, 0.1), 0.0, 0.088),
        (tf.keras.initializers.Zeros(), 0.0, 0.0),
        (tf.keras.initializers.Constant(0.3), 0.3, 0.0),
    ],
)
def test_normal_and_constant_initializers_are_drawn_like_their_kind(init, mean, std):
    rows = initial_rows(init, KEYS, 16, "item", tf.float32).numpy()
    assert abs(rows.mean() - mean) < 0.01
    assert abs(rows.std() - std) < 0.01


def test_an_initializer_that_cannot_be_drawn_per_key_is_named():
    with pytest.raises(NotImplementedError, match="Received: embeddings_initializer=Orthogonal"):
        initial_rows(tf.keras.initializers.Orthogonal(), KEYS, 4, "item", tf.float32)
