"""16-bit table storage: stochastic rounding of new rows into a 16-bit table.

A table stored in 16 bits (``DistributedEmbeddings(..., table_dtype="bfloat16")``) is read
into the block's dtype and updated in float32: the optimizer computes the new row in float32
and :func:`stochastic_round` stores it. Rounding to nearest would lose every update smaller
than half a 16-bit step (bfloat16 keeps 8 significant bits: an update below ~0.2% of the
weight vanishes, so training stalls); stochastic rounding goes up with probability
``(x - low) / (high - low)``, so the stored row equals the float32 row in expectation.

The random draw is a hash of the element's place in the whole table (row, column), the
optimizer step and the table's name, not a random generator's state: a row rounds the same
whichever rank holds it, so N ranks still train as one process does. bfloat16 is the upper
half of float32, so its rounding is an integer add of 16 random bits and a mask; float16
picks between the two neighbours explicitly.

Example:
    >>> bits = random_bits(row_ids, 0, 16, 16, step, "items")  # doctest: +SKIP
    >>> stochastic_round(new_rows, tf.bfloat16, bits)  # doctest: +SKIP
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import tensorflow as tf

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # a 32-bit integer hash's multiplier; products stay below 2**59 in int64


def is_narrow(dtype) -> bool:
    """True for a 16-bit float: a table stored in it needs :func:`stochastic_round`."""
    return tf.as_dtype(dtype).size == 2


def widened(x):
    """``x`` in float32 when it is a 16-bit float (gradients of 16-bit tables are summed and
    applied in float32), else unchanged."""
    if isinstance(x, tf.IndexedSlices):
        return tf.IndexedSlices(widened(x.values), x.indices, x.dense_shape)
    return tf.cast(x, tf.float32) if x.dtype.size == 2 else x


def read_wide(rows, dtype):
    """A 16-bit table's looked-up ``rows`` in the block's ``dtype``, their gradient kept in
    ``dtype`` on its way back to the table (TF's cast gradient would narrow it: a float16
    gradient element above 65504 is inf before the float32 update sees it)."""
    if rows.dtype == dtype:
        return rows

    @tf.custom_gradient
    def cast(x):
        return tf.cast(x, dtype), lambda dy: dy

    return cast(rows)


class RoundedTables(NamedTuple):
    """A block's model-parallel tables stored in a 16-bit ``dtype``, the same on every rank:
    the block marks its local variables with it (:func:`mark_rounded_tables`) so that an
    optimizer writing 16-bit rows knows, on a rank that holds none of them, which ranks'
    updates it must agree with (``rowwise/storable.py``).

    Attributes:
        prefix: The block's collective prefix (its name and tables).
        owner: The key of the block's table marks (``variables.TableMark.owner``).
        world_size: The block's ranks.
        dtype: The tables' dtype name.
        tables: The tables, in plan order.
    """

    prefix: str
    owner: int
    world_size: int
    dtype: str
    tables: tuple


_ROUNDED_ATTR = "_mmde_rounded_tables"  # set by the backend's build, read here only


def mark_rounded_tables(var, tables: RoundedTables) -> None:
    """Marks ``var`` (a local variable of the block) with the block's 16-bit tables."""
    setattr(var, _ROUNDED_ATTR, tables)


def rounded_tables(var) -> RoundedTables | None:
    """The :class:`RoundedTables` of a variable :func:`mark_rounded_tables` marked, else None."""
    return getattr(var, _ROUNDED_ATTR, None)


def largest_magnitude(rows):
    """The largest |value| of float32 ``rows`` (0 for none), inf when any is inf or NaN: a
    16-bit table holds the rows only when it is at most its dtype's largest value (rounding
    would store inf, which turns to NaN in the next step). Two reductions, for every step."""
    largest = tf.reduce_max(tf.concat([tf.reshape(tf.abs(rows), [-1]), [0.0]], 0))
    finite = tf.math.is_finite(tf.reduce_sum(rows * 0.0))  # NaN once any is inf or NaN
    return tf.where(finite, largest, float("inf"))


def _hash32(x):
    """A 32-bit integer hash of int64 ``x`` (values in [0, 2**32))."""
    x = tf.bitwise.bitwise_and(tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 32)), _MASK32)
    for _ in range(2):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
        x = tf.bitwise.bitwise_and(x * _MIX, _MASK32)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def random_bits(rows, first_col: int, cols: int, dim: int, step, table: str):
    """Per element of the rows ``rows`` (global row ids, int64 ``[n]``) and columns
    ``first_col .. first_col + cols`` of a ``dim``-wide table, 32 random bits (an int64 in
    [0, 2**32)) that depend only on the element, ``step`` and ``table`` (elements below 2**40)."""
    salt = zlib.crc32(table.encode())
    step_key = tf.bitwise.bitwise_and(
        _hash32(tf.cast(step, tf.int64) * 0x85EBCA77 + salt), 0x7FFFFF
    )
    cells = tf.cast(rows, tf.int64)[:, None] * dim + (first_col + tf.range(cols, dtype=tf.int64))
    return _hash32(cells + tf.bitwise.left_shift(step_key, 40))


def _next_away(narrow, toward_positive):
    """The 16-bit neighbour of ``narrow`` toward +inf (``toward_positive``) or -inf: 16-bit
    floats are sign and magnitude, so a step is +-1 on the bits (a zero steps to the smallest
    number of the asked sign)."""
    bits = tf.cast(tf.bitcast(narrow, tf.uint16), tf.int32)
    zero = tf.bitwise.bitwise_and(bits, 0x7FFF) == 0
    negative = bits >= 0x8000
    up = tf.where(zero, 0x0001, tf.where(negative, bits - 1, bits + 1))
    down = tf.where(zero, 0x8001, tf.where(negative, bits + 1, bits - 1))
    out = tf.where(toward_positive, up, down)
    return tf.bitcast(tf.cast(out, tf.uint16), narrow.dtype)


def stochastic_round(x, dtype, bits):
    """float32 ``x`` in the 16-bit ``dtype``: one of its two neighbours, the upper one with
    probability ``(x - low) / (high - low)``, decided by ``bits`` (from :func:`random_bits`,
    shaped like ``x``); values a 16-bit float holds exactly stay as they are."""
    if tf.as_dtype(dtype) == tf.bfloat16:
        # bfloat16 is float32's upper half: add 16 random bits below it, then cut them off
        low = tf.cast(tf.bitwise.right_shift(bits, 16), tf.int32)
        cut = tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32) + low, -65536)  # 0xFFFF0000
        return tf.cast(tf.bitcast(cut, tf.float32), tf.bfloat16)  # exact
    noise = tf.cast(bits, tf.float32) * (1.0 / 2**32)
    nearest = tf.cast(x, dtype)
    wide = tf.cast(nearest, tf.float32)
    error = x - wide  # the neighbour on the other side of x is one step away from nearest
    other = _next_away(nearest, error > 0)
    step = tf.abs(tf.cast(other, tf.float32) - wide)
    take_other = noise < tf.math.divide_no_nan(tf.abs(error), step)
    finite = tf.math.is_finite(wide) & tf.math.is_finite(tf.cast(other, tf.float32))
    return tf.where(take_other & finite & (error != 0), other, nearest)
