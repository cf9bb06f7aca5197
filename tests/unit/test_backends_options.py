"""The exchange's options every backend reads (backends/options.py): checked without loading
TensorFlow (the commands check their options first), a bad value named with the choices."""

import subprocess
import sys

import pytest

from merlin_models_de.backends.options import EXCHANGE_DTYPES, exchange_dtype_name


def test_exchange_dtypes_are_checked_without_loading_tensorflow():
    code = (
        "import sys; from merlin_models_de.backends.options import exchange_dtype_name; "
        "print(exchange_dtype_name('bfloat16'), 'tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["bfloat16", "False"], out.stderr[-2000:]


def test_a_dtype_or_its_name_is_accepted_and_anything_else_named():
    import tensorflow as tf

    assert [exchange_dtype_name(tf.as_dtype(n)) for n in EXCHANGE_DTYPES] == list(EXCHANGE_DTYPES)
    assert exchange_dtype_name(None) is None
    with pytest.raises(
        ValueError, match=r"\['float16', 'bfloat16'\]. Received: exchange_dtype='int8'"
    ):
        exchange_dtype_name("int8")
