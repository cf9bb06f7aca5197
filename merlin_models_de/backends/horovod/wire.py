"""Payload packing: the dtype looked-up rows travel in between ranks (the block's
``exchange_dtype``), and payloads of several dtypes as units of one.

Rows cross the all-to-all in a narrower float and are widened on arrival; their gradients
go back the same way (TF's cast gradient narrows them). Each row is rounded exactly once each
way, at the same point whatever the world size (one process rounds too), so N ranks still
train as one process on the global batch does.

The dtype names and their check are the exchange's option, shared by every backend
(``backends/options.py``).

Example:
    >>> to_wire(tf.ones([2], tf.float32), "bfloat16").dtype  # doctest: +SKIP
    tf.bfloat16
"""

from __future__ import annotations

# TensorFlow loads on first use only: the commands check their options before it loads
from merlin_models_de.comm import tf


def to_wire(x, name: str | None):
    """``x`` narrowed to the exchange dtype (unchanged when None or already narrower)."""
    if name is None or x.dtype.size <= 2:  # every options.EXCHANGE_DTYPES entry: 2 bytes
        return x
    return tf.cast(x, name)


def from_wire(x, dtype):
    """``x`` back in the block's ``dtype``."""
    return x if x.dtype == dtype else tf.cast(x, dtype)


def units(x, unit):
    """``x`` flat, as ``unit`` elements, bit for bit (``unit`` no wider than ``x``'s dtype):
    payloads of several dtypes travel in one all-to-all of the narrowest."""
    if x.dtype == unit and x.shape.rank == 1:
        return x
    x = tf.reshape(x, [-1])
    return x if x.dtype == unit else tf.reshape(tf.bitcast(x, unit), [-1])


def from_units(x, dtype):
    """The inverse of :func:`units`."""
    if x.dtype == dtype:
        return x
    if dtype.size == x.dtype.size:
        return tf.bitcast(x, dtype)
    return tf.bitcast(tf.reshape(x, [-1, dtype.size // x.dtype.size]), dtype)
