"""The plan's types (planner/types.py): a plan survives its JSON form, counts a rank's bytes
with the optimizer's state, and names what it does not know. Pure Python."""

import json

import pytest

from merlin_models_de.planner import plan
from merlin_models_de.planner.types import (
    Shard,
    ShardingPlan,
    ShardingType,
    optimizer_slots,
    row_slots,
)
from merlin_models_de.tables import FeatureSpec, TableSpec

TABLES = [
    TableSpec(name, rows, 4, (FeatureSpec(name, name),))
    for name, rows in (("a", 100), ("b", 50), ("c", 2))
]


def test_a_plan_round_trips_through_json():
    placed = plan(TABLES, 2, data_parallel_threshold=8, column_slice_threshold=300)
    again = ShardingPlan.from_dict(json.loads(json.dumps(placed.to_dict())))
    assert again == placed


def test_replicated_tables_are_on_every_rank_but_stored_by_rank_zero():
    placed = plan(TABLES, 2, data_parallel_threshold=8)
    assert placed.kind_of("c") is ShardingType.DATA_PARALLEL
    assert [s.rank for s in placed.shards_of("c")] == [0, 1]
    assert [s.rank for s in placed.stored_shards_of("c")] == [0]
    assert all(s.table != "c" for s in placed.stored_shards_on(1))


def test_rank_bytes_count_parameters_slot_copies_and_row_state():
    shard = Shard("a", 0, ShardingType.TABLE_WISE, 0, 100, 0, 4)
    one = ShardingPlan(1, "basic", (TABLES[0],), (shard,))
    assert one.rank_elements(0) == 400
    assert one.rank_bytes(0, "sgd") == 400 * 4
    assert one.rank_bytes(0, "adam") == 400 * 4 * 3  # two slot copies
    assert one.rank_bytes(0, "rowwise_adagrad") == 400 * 4 + 100 * 4  # one value a row
    assert one.rank_bytes(0, "adagrad", table_bytes=2) == 400 * 2 + 400 * 4
    assert one.balance() == 1.0


def test_unknown_names_are_named():
    with pytest.raises(ValueError, match="optimizer='adamw'"):
        optimizer_slots("adamw")
    with pytest.raises(ValueError, match="optimizer='lion'"):
        row_slots("lion")
    assert (optimizer_slots("Adam"), row_slots("RowWise_Adagrad")) == (2, 1)
    with pytest.raises(KeyError, match="'zz'"):
        plan(TABLES, 2).table("zz")
