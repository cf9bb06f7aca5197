"""The block's two option objects (block/options.py): made of today's keywords or given, a
keyword beside its object refused naming both, the config written as the objects' fields, and
a config saved with the keywords (before the objects) loading to the same block."""

import pytest
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, ExchangeOptions, PlacementOptions
from merlin_models_de.block.options import block_options, from_options_config
from tests.schemas import cat


def schema():
    return Schema([cat("user", 99), cat("item", 49), cat("tiny", 4)])


def test_keywords_make_the_objects_and_leave_keras_its_own():
    kwargs = dict(strategy="memory_optimized", data_parallel_threshold=5, table_dtype="bfloat16")
    kwargs["dtype"] = "float32"
    placement, exchange = block_options(None, None, kwargs)
    assert placement == PlacementOptions("memory_optimized", data_parallel_threshold=5)
    assert exchange == ExchangeOptions(table_dtype="bfloat16")
    assert kwargs == {"dtype": "float32"}
    given = PlacementOptions("basic")
    assert block_options(given, None, {}) == (given, ExchangeOptions())


def test_a_keyword_beside_its_object_is_refused_naming_both():
    with pytest.raises(ValueError) as err:
        block_options(None, ExchangeOptions(), {"validate_ids": False})
    assert str(err.value).startswith("exchange= already gives every one of its options")
    assert "Received: validate_ids=False and exchange=ExchangeOptions(" in str(err.value)
    with pytest.raises(ValueError, match="Received: strategy='basic' and placement="):
        DistributedEmbeddings(schema(), dim=4, placement=PlacementOptions(), strategy="basic")


def test_the_objects_and_the_keywords_make_the_same_block():
    placement = PlacementOptions("memory_optimized", data_parallel_threshold=300)
    exchange = ExchangeOptions(validate_ids=False, exchange_ahead=False)
    by_objects = DistributedEmbeddings(schema(), dim=4, placement=placement, exchange=exchange)
    by_keywords = DistributedEmbeddings(
        schema(),
        dim=4,
        strategy="memory_optimized",
        data_parallel_threshold=300,
        validate_ids=False,
        exchange_ahead=False,
    )
    assert by_objects.get_config() == by_keywords.get_config()
    assert by_objects.plan == by_keywords.plan
    assert by_objects.plan.kind_of("tiny").value == "data_parallel"
    assert (by_objects.validate_ids, by_objects.exchange_ahead) == (False, False)
    config = by_objects.get_config()
    assert config["placement"] == placement.to_config()
    assert config["exchange"] == exchange.to_config()
    again = DistributedEmbeddings.from_config(config)
    assert (again.placement_options, again.exchange_options) == (placement, exchange)


def test_a_config_saved_with_the_keywords_loads_to_the_same_block():
    """The config as get_config wrote it before the option objects: the options flat."""
    block = DistributedEmbeddings(
        schema(),
        dim=4,
        placement=PlacementOptions("memory_balanced", 200, None, 10),
        exchange=ExchangeOptions(validate_ids=False, exchange_dtype="bfloat16"),
    )
    config = block.get_config()
    saved = {k: v for k, v in config.items() if k not in ("placement", "exchange")}
    saved.update(
        backend="auto",
        validate_ids=False,
        exchange_dtype="bfloat16",
        table_dtype=None,
        exchange_ahead=True,
        merge_backward=True,
        strategy="memory_balanced",
        column_slice_threshold=200,
        row_slice_threshold=None,
        data_parallel_threshold=10,
    )
    assert from_options_config(saved) == saved  # nothing to convert: the block reads them
    loaded = DistributedEmbeddings.from_config(saved)
    # (the schema's JSON text may differ after a round trip)
    assert {k: v for k, v in loaded.get_config().items() if k != "schema"} == {
        k: v for k, v in config.items() if k != "schema"
    }
    assert loaded.plan == block.plan
    assert loaded.backend.exchange_dtype == "bfloat16" and loaded.validate_ids is False
