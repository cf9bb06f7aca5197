"""The exchange's options every backend reads (backends/options.py): a dtype or its name, a
bad value named with the choices (that the module loads no TensorFlow is checked with the
package's other TF-free modules, tests/commands/test_merlin_models_de.py)."""

import pytest

from merlin_models_de.backends.options import EXCHANGE_DTYPES, exchange_dtype_name


def test_a_dtype_or_its_name_is_accepted_and_anything_else_named():
    import tensorflow as tf

    assert [exchange_dtype_name(tf.as_dtype(n)) for n in EXCHANGE_DTYPES] == list(EXCHANGE_DTYPES)
    assert exchange_dtype_name(None) is None
    with pytest.raises(
        ValueError, match=r"\['float16', 'bfloat16'\]. Received: exchange_dtype='int8'"
    ):
        exchange_dtype_name("int8")
