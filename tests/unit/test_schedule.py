"""The step schedule (backends/horovod/schedule.py): the stages of each kind of call, and
docs/design.md's table, which is :meth:`StepSchedule.table`'s output for the DLRM command's
plan (Criteo, ``work_balanced``, 2 ranks). The order a traced step runs them in:
tests/ranks/test_pipeline.py."""

import pathlib
import re

from merlin_models_de.apps.common.schemas import load_schema
from merlin_models_de.backends.horovod.pipeline import STAGES
from merlin_models_de.backends.horovod.schedule import AHEAD_ONLY, StepSchedule
from merlin_models_de.planner import plan
from merlin_models_de.planner.routing import Routing
from merlin_models_de.tables import FeatureSpec, TableSpec, tables_from_schema

DESIGN = pathlib.Path(__file__).resolve().parents[2] / "docs" / "design.md"


def schedule_of(tables, world_size=2, **options) -> StepSchedule:
    features = [f for t in tables for f in t.features]
    return StepSchedule.build(
        Routing.build(plan(tables, world_size, **options), features), features
    )


def test_design_md_prints_the_dlrm_plans_schedule():
    tables = tables_from_schema(load_schema("criteo"))
    table = schedule_of(tables, strategy="work_balanced").table()
    text = DESIGN.read_text()
    assert table in text, table
    assert len(re.findall(r"^\| collective \| op \|", text, flags=re.M)) == 1


def test_a_plain_call_exchanges_its_ids_and_a_step_ahead_sends_the_next():
    user = FeatureSpec("user", "user")
    tags = FeatureSpec("tags", "tags", multi_hot=True, combiner="sum")
    item = FeatureSpec("item", "item")
    tables = [
        TableSpec("user", 1000, 8, (user,)),
        TableSpec("tags", 1000, 4, (tags,)),
        TableSpec("item", 100_000, 8, (item,)),
    ]
    schedule = schedule_of(tables, row_slice_threshold=50_000 * 8)
    plain = [s.kind for s in schedule.for_call(ahead=False)]
    ahead = [s.kind for s in schedule.for_call(ahead=True)]
    assert plain == ["ids", "unpack", "values", "lookup", "vectors", "row_sliced", "assemble"]
    assert ahead == [
        "kept_or_ids",
        "next_ids",
        "unpack",
        "values",
        "lookup",
        "vectors",
        "row_sliced",
        "assemble",
        "keep",
    ]
    assert {*plain, *ahead} <= set(STAGES)
    assert not set(AHEAD_ONLY) & set(plain)
    assert [c.name for c in schedule.forward(ahead=True)] == [
        "ids",
        "values",
        "vectors",
        "rw_item_ids",
        "rw_item_rows",
    ]


def test_without_pooled_rows_the_next_ids_go_alone():
    item = FeatureSpec("item", "item")
    schedule = schedule_of([TableSpec("item", 100_000, 8, (item,))], row_slice_threshold=1)
    assert [c.name for c in schedule.forward(ahead=True)] == [
        "ids",
        "rw_item_ids",
        "rw_item_rows",
        "ids_next",
    ]
    assert [c.name for c in schedule.forward(ahead=False)] == ["ids", "rw_item_ids", "rw_item_rows"]
    assert [c.name for c in schedule.in_fit(next_batch=True, merged=True)][
        -1
    ] == "mmde_grad_float32"
