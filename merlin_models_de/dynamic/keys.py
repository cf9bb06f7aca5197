"""What a key decides by itself: its owner rank and its new row's values.

Both are functions of the key alone (and the table's name), so N ranks and one process give
a key the same row when it is admitted, and a checkpoint restored into another world size
finds each key's new owner by recomputing :func:`owner_of`. The hash is SplitMix64's
finalizer, in unsigned 64-bit TensorFlow ops (the same on every device).

Example:
    >>> owner_of(tf.constant([1, 2, 3], tf.int64), 2)  # doctest: +SKIP
"""

from __future__ import annotations

import zlib

import tensorflow as tf

GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment
OWNER_SALT = 0x5DEECE66D  # keeps the owner's hash apart from the rows' draws


def _u64(value: int):
    return tf.constant(value & (2**64 - 1), tf.uint64)


def mix(x):
    """SplitMix64's finalizer of uint64 ``x``: a well-spread uint64 of the same shape."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(30))) * _u64(0xBF58476D1CE4E5B9)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(27))) * _u64(0x94D049BB133111EB)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(31)))


def owner_of(keys, world_size: int):
    """int32 owner rank of each int64 key (the same for a key in every plan)."""
    h = mix(tf.bitcast(keys, tf.uint64) + _u64(OWNER_SALT))
    return tf.cast(tf.math.floormod(h, _u64(world_size)), tf.int32)


def table_salt(table: str) -> int:
    """A number that makes two tables draw different rows for one key."""
    return zlib.crc32(table.encode()) * GOLDEN


def key_uniforms(keys, dim: int, salt: int):
    """float64 ``[len(keys), dim]`` in [0, 1), drawn from each key and column alone."""
    base = tf.bitcast(keys, tf.uint64)[:, None] * _u64(GOLDEN) + _u64(salt)
    columns = tf.range(1, dim + 1, dtype=tf.int64)
    x = mix(base + tf.bitcast(columns, tf.uint64)[None, :] * _u64(0xD1B54A32D192ED03))
    return tf.cast(tf.bitwise.right_shift(x, _u64(11)), tf.float64) * 2.0**-53


def initial_rows(initializer, keys, dim: int, table: str, dtype):
    """``[len(keys), dim]`` first values of the rows ``keys`` are given, drawn from each key
    like ``initializer`` (RandomUniform, RandomNormal, TruncatedNormal, Zeros, Constant).

    Raises NotImplementedError naming the initializer for another kind: the rows of a
    growing table are drawn per key, which needs a distribution drawn from uniforms.
    """
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    kind = type(initializer).__name__
    n = tf.shape(keys)[0]
    if kind in ("Zeros", "Constant"):
        value = float(config.get("value", 0.0))
        return tf.fill(tf.stack([n, dim]), tf.constant(value, dtype))
    u = key_uniforms(keys, dim, table_salt(table))
    if kind == "RandomUniform":
        low, high = float(config["minval"]), float(config["maxval"])
        return tf.cast(low + (high - low) * u, dtype)
    if kind in ("RandomNormal", "TruncatedNormal"):
        # Box-Muller on two draws per value; truncated: redrawn values beyond 2 stddevs are
        # folded back inside (a per-key draw cannot redraw)
        v = key_uniforms(keys, dim, table_salt(table) ^ OWNER_SALT)
        z = tf.sqrt(-2.0 * tf.math.log1p(-u)) * tf.cos(2.0 * 3.141592653589793 * v)
        if kind == "TruncatedNormal":
            z = tf.math.floormod(z + 2.0, 4.0) - 2.0
        return tf.cast(float(config["mean"]) + float(config["stddev"]) * z, dtype)
    raise NotImplementedError(
        f"Dynamic table '{table}' draws each new row from its key, which it can do for "
        "RandomUniform, RandomNormal, TruncatedNormal, Zeros and Constant initializers. "
        f"Received: embeddings_initializer={kind}"
    )
