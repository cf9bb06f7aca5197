"""A list feature's ids per sample, as its schema declares them (``value_count``): read once
by ``tables_from_schema``, so the block and the plan command place ``work_balanced`` alike."""

import numpy as np
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de.planner import plan
from merlin_models_de.planner.work import rank_times
from merlin_models_de.tables import FeatureSpec, TableSpec, declared_hotness, tables_from_schema


def column(name, rows, value_count=None, is_list=False):
    properties = {"domain": {"min": 0, "max": rows - 1}}
    if value_count is not None:
        properties["value_count"] = value_count
    return ColumnSchema(
        name,
        tags=[Tags.CATEGORICAL],
        dtype=np.int64,
        is_list=is_list or value_count is not None,
        is_ragged=is_list or value_count is not None,
        properties=properties,
    )


def test_a_list_feature_carries_the_ids_per_sample_its_schema_declares():
    schema = Schema(
        [
            column("history", 500, {"min": 1, "max": 20}),
            column("genres", 50, {"min": 3}),  # a lower bound only
            column("tags", 50, is_list=True),  # nothing declared
            column("user", 100),
        ]
    )
    assert [declared_hotness(schema[name]) for name in schema.column_names] == [
        (20.0, "max"),
        (3.0, "min"),
        (None, None),
        (None, None),
    ]
    hotness = {f.name: f.hotness for t in tables_from_schema(schema, dim=4) for f in t.features}
    assert hotness == {"history": 20.0, "genres": 3.0, "tags": None, "user": None}


def test_the_declared_hotness_places_and_prices_as_if_given():
    def tables(declared):
        return [
            TableSpec("t0", 20000, 8, (FeatureSpec("t0", "t0", True, "sum", hotness=declared),)),
            TableSpec("t1", 1000, 8, (FeatureSpec("t1", "t1", True, "sum"),)),
            TableSpec("t2", 5000, 8, (FeatureSpec("t2", "t2"),)),
            TableSpec("t3", 1000, 8, (FeatureSpec("t3", "t3"),)),
        ]

    declared = plan(tables(32.0), 2, "work_balanced")
    # the same placement as the hotness given by hand, another than the default 4 ids
    given = plan(tables(32.0), 2, "work_balanced", hotness={"t0": 32.0})
    assert declared.shards == given.shards
    assert [[s.table for s in declared.shards_on(r)] for r in range(2)] == [
        ["t0"],
        ["t1", "t2", "t3"],
    ]
    assert declared.shards != plan(tables(None), 2, "work_balanced").shards
    # a value given by the caller still wins over the declared one
    assert plan(tables(32.0), 2, "work_balanced", hotness=4.0).shards == (
        plan(tables(None), 2, "work_balanced").shards
    )
    assert rank_times(declared, 512) == rank_times(declared, 512, hotness={"t0": 32.0})


def test_a_plan_round_trips_the_declared_hotness_and_reads_plans_without_it():
    from merlin_models_de.planner.types import ShardingPlan

    declared = FeatureSpec("t", "t", True, "sum", hotness=6.0)
    p = plan(
        [TableSpec("t", 100, 4, (declared,)), TableSpec("u", 100, 4, (FeatureSpec("u", "u"),))], 2
    )
    assert ShardingPlan.from_dict(p.to_dict()) == p
    written = p.to_dict()
    # written only where declared: without one, a manifest reads as before the field
    assert [list(t["features"][0]) for t in written["tables"]] == [
        ["name", "table", "multi_hot", "combiner", "hotness"],
        ["name", "table", "multi_hot", "combiner"],
    ]
    del written["tables"][0]["features"][0]["hotness"]  # a manifest from before the field
    written["tables"][1]["features"][0]["later"] = 1  # or a key a later version adds
    tables = ShardingPlan.from_dict(written).tables
    assert [t.features[0].hotness for t in tables] == [None, None]
