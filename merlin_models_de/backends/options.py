"""Options of how the exchange runs that every backend reads (no TensorFlow import).

The exchange dtype is the float looked-up rows and their gradients cross ranks in; a backend
that cannot narrow them says so (``EmbeddingBackend.unsupported``). The commands check it
before TensorFlow loads.

Example:
    >>> exchange_dtype_name("bfloat16")
    'bfloat16'
"""

from __future__ import annotations

EXCHANGE_DTYPES = ("float16", "bfloat16")


def exchange_dtype_name(value) -> str | None:
    """``value`` (None, a name or a ``tf.DType``) as a name from EXCHANGE_DTYPES, or None.

    Raises ValueError naming the option and the value received.
    """
    if value is None:
        return None
    name = getattr(value, "name", value)  # a tf.DType, or its name
    if not isinstance(name, str) or name not in EXCHANGE_DTYPES:
        raise ValueError(
            f"exchange_dtype must be None (rows travel in the block's dtype) or "
            f"one of {list(EXCHANGE_DTYPES)}. Received: exchange_dtype={value!r}"
        )
    return name


__all__ = ["EXCHANGE_DTYPES", "exchange_dtype_name"]
