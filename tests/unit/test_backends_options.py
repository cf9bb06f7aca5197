"""The exchange's options every backend reads (backends/options.py): ExchangeOptions checks each
option when made, naming it and the value; a dtype or its name, a
bad value named with the choices (that the module loads no TensorFlow is checked with the
package's other TF-free modules, tests/commands/test_merlin_models_de.py)."""

import pytest

from merlin_models_de.backends.options import EXCHANGE_DTYPES, ExchangeOptions, exchange_dtype_name


def test_a_dtype_or_its_name_is_accepted_and_anything_else_named():
    import tensorflow as tf

    assert [exchange_dtype_name(tf.as_dtype(n)) for n in EXCHANGE_DTYPES] == list(EXCHANGE_DTYPES)
    assert exchange_dtype_name(None) is None
    with pytest.raises(
        ValueError, match=r"\['float16', 'bfloat16'\]. Received: exchange_dtype='int8'"
    ):
        exchange_dtype_name("int8")


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("backend", "nccl", "Unknown backend; expected one of"),
        ("validate_ids", 0, "validate_ids must be True or False"),
        ("exchange_ahead", "no", "exchange_ahead must be True or False"),
        ("merge_backward", None, "merge_backward must be True or False"),
        ("exchange_dtype", "int8", "exchange_dtype must be None"),
        ("table_dtype", "float64", "table_dtype must be None"),
    ],
)
def test_exchange_options_name_a_bad_option_with_its_value(option, value, message):
    with pytest.raises(ValueError) as err:
        ExchangeOptions(**{option: value})
    assert message in str(err.value)
    assert str(err.value).endswith(f"Received: {option}={value!r}")


def test_exchange_options_keep_dtype_names_and_round_trip_their_config():
    import tensorflow as tf

    options = ExchangeOptions(exchange_dtype=tf.bfloat16, table_dtype=tf.float16)
    assert (options.exchange_dtype, options.table_dtype) == ("bfloat16", "float16")
    assert options == ExchangeOptions(exchange_dtype="bfloat16", table_dtype="float16")
    assert ExchangeOptions.from_config(options.to_config()) == options
    assert options.to_config() == {
        "backend": "auto",
        "validate_ids": True,
        "exchange_dtype": "bfloat16",
        "table_dtype": "float16",
        "exchange_ahead": True,
        "merge_backward": True,
    }
    with pytest.raises(ValueError, match=r"exchange has no options \['dtype'\]"):
        ExchangeOptions.from_config({"dtype": "float16"})
