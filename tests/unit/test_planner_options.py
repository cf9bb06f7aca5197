"""PlacementOptions (planner/options.py): every option checked when the object is made, named
with the value received; plan() takes the object, a strategy name or the keywords, and places
the same; a keyword beside the object is refused naming both (pure Python)."""

import dataclasses
import json

import pytest

from merlin_models_de.planner import PlacementOptions, plan, validate_options
from merlin_models_de.planner.options import from_keywords
from merlin_models_de.tables import FeatureSpec, TableSpec

TABLES = [
    TableSpec("a", 1000, 8, (FeatureSpec("a", "a"),)),
    TableSpec("m", 500, 4, (FeatureSpec("m", "m", multi_hot=True, combiner="sum"),)),
    TableSpec("c", 10, 4, (FeatureSpec("c", "c"),)),
]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("strategy", "snake", "Unknown strategy; expected one of"),
        ("column_slice_threshold", 0, "column_slice_threshold must be a positive int or None"),
        ("row_slice_threshold", True, "row_slice_threshold must be a positive int or None"),
        ("data_parallel_threshold", 1.5, "data_parallel_threshold must be a positive int or"),
        ("max_rank_elements", -1, "max_rank_elements must be a positive int or None"),
        ("batch_size", 0, "batch_size must be an int >= 1"),
        ("hotness", {"m": -2}, "hotness of feature 'm' must be a number >= 0"),
        ("optimizer", "adamw2", "Unknown optimizer"),
        ("link", "carrier-pigeon", "Unknown link"),
    ],
)
def test_a_bad_option_is_named_with_its_value(option, value, message):
    with pytest.raises(ValueError) as err:
        PlacementOptions(**{option: value})
    assert message in str(err.value)
    assert str(err.value).endswith(f"Received: {option}={value!r}")


def test_the_object_is_frozen_and_keeps_its_own_copy_of_hotness():
    hotness = {"m": 3}
    options = PlacementOptions(hotness=hotness)
    hotness["m"] = 99
    assert options.hotness == {"m": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.strategy = "basic"  # type: ignore[misc]
    assert hash(options) == hash(PlacementOptions(hotness={"m": 5}))  # hotness is not hashed


def test_the_config_round_trips_and_an_unknown_key_is_named():
    options = PlacementOptions("work_balanced", 4000, None, 20, 64, {"m": 2.5}, "adam")
    assert PlacementOptions.from_config(options.to_config()) == options
    with pytest.raises(ValueError, match=r"placement has no options \['stratgy'\]"):
        PlacementOptions.from_config({"stratgy": "basic"})


def test_plan_takes_the_object_a_strategy_name_or_the_keywords_alike():
    keywords = dict(column_slice_threshold=2000, data_parallel_threshold=40)
    by_keywords = plan(TABLES, 2, strategy="memory_balanced", **keywords)
    assert plan(TABLES, 2, "memory_balanced", **keywords) == by_keywords
    assert plan(TABLES, 2, PlacementOptions("memory_balanced", **keywords)) == by_keywords
    assert by_keywords.options == (
        ("column_slice_threshold", 2000),
        ("data_parallel_threshold", 40),
        ("row_slice_threshold", None),
    )
    # the step work_balanced predicts reaches it from the object as from the keywords
    step = dict(batch_size=64, hotness={"m": 30.0}, optimizer="adam", link="nvlink-nccl")
    assert plan(TABLES, 2, PlacementOptions("work_balanced", **step)) == plan(
        TABLES, 2, "work_balanced", **step
    )


def test_plan_refuses_a_keyword_beside_the_object_and_an_unknown_keyword():
    with pytest.raises(ValueError) as err:
        plan(TABLES, 2, PlacementOptions(), row_slice_threshold=10)
    assert "Received: row_slice_threshold=10 and placement=PlacementOptions(" in str(err.value)
    with pytest.raises(TypeError, match=r"strategy twice. Received: placement='basic', strat"):
        plan(TABLES, 2, "basic", strategy="memory_balanced")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['rows_per_rank'\]"):
        plan(TABLES, 2, rows_per_rank=3)
    with pytest.raises(ValueError, match="max_rank_elements must be a positive int or None"):
        plan(TABLES, 2, max_rank_elements=0)


def test_from_keywords_pops_only_the_accepted_names():
    keywords = {"strategy": "memory_optimized", "batch_size": 8, "dtype": "float32"}
    made = from_keywords(PlacementOptions, None, keywords, "placement", ("strategy",))
    assert made == PlacementOptions("memory_optimized")
    assert keywords == {"batch_size": 8, "dtype": "float32"}  # left to the caller
    with pytest.raises(TypeError, match="placement must be a PlacementOptions"):
        from_keywords(PlacementOptions, {"strategy": "basic"}, {}, "placement")


def test_validate_options_checks_the_world_size_then_the_options():
    validate_options(2, "memory_balanced", 10, None, 3)
    with pytest.raises(ValueError, match="Received: world_size=0"):
        validate_options(0)
    with pytest.raises(ValueError, match="Received: data_parallel_threshold=0"):
        validate_options(2, data_parallel_threshold=0)


def test_a_plan_records_what_shaped_it_so_planning_again_places_the_same():
    """An elastic reset's memory check plans the saved tables again from the plan's options
    (after a JSON round trip, as a manifest keeps them): the step of work_balanced and the cap
    must come back, or the re-plan places for the default step."""
    from merlin_models_de.planner.types import ShardingPlan

    step = dict(batch_size=64, hotness={"m": 30.0}, optimizer="sgd", link="nvlink-nccl")
    for options in (
        PlacementOptions("work_balanced", column_slice_threshold=2000, **step),
        PlacementOptions("memory_balanced", max_rank_elements=10**7),
    ):
        first = plan(TABLES, 2, options)
        saved = ShardingPlan.from_dict(json.loads(json.dumps(first.to_dict())))
        again = plan(saved.tables, 2, saved.strategy, **dict(saved.options))
        assert again.shards == first.shards and again.options == first.options
    recorded = dict(plan(TABLES, 2, PlacementOptions("work_balanced", **step)).options)
    assert {k: recorded[k] for k in step} == step
    assert "batch_size" not in dict(plan(TABLES, 2, PlacementOptions(batch_size=64)).options)
