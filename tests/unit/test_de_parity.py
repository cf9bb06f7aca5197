"""Placement parity: for the same tables and options, NVIDIA distributed-embeddings places
every table / slice on the same rank as our planner. Skips where DE does not import."""

import pytest

from merlin_models_de import make_plan
from merlin_models_de.apps.common.schemas import synthetic_schema
from merlin_models_de.backends.registry import is_importable
from merlin_models_de.tables import tables_from_schema

pytestmark = pytest.mark.skipif(
    not is_importable("distributed-embeddings"),
    reason="NVIDIA distributed-embeddings does not import here",
)

OPTIONS = [
    dict(strategy="basic"),
    dict(strategy="memory_balanced"),
    dict(strategy="memory_optimized"),
    dict(strategy="basic", column_slice_threshold=2**20),
    dict(strategy="memory_balanced", column_slice_threshold=2**22),
    dict(strategy="memory_optimized", column_slice_threshold=2**24),
    dict(strategy="memory_optimized", data_parallel_threshold=10_000),
    dict(strategy="memory_balanced", row_slice_threshold=2**26),
    dict(
        strategy="memory_optimized",
        column_slice_threshold=2**21,
        data_parallel_threshold=50_000,
        row_slice_threshold=10**8,
    ),
]


@pytest.mark.parametrize("dataset", ["criteo", "aliccp-raw"])
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_de_places_like_our_planner(dataset, world_size, options):
    from merlin_models_de.backends.distributed_embeddings import (
        de_placement,
        de_strategy,
        plan_placement,
    )

    tables = tables_from_schema(synthetic_schema(dataset), dim=16)
    ours = make_plan(tables, world_size, **options)
    theirs = de_placement(de_strategy(ours, tables), [t.name for t in tables], world_size)
    assert theirs == plan_placement(ours)


def test_shared_tables_follow_the_input_table_map():
    from merlin_models_de.backends.distributed_embeddings import (
        de_placement,
        de_strategy,
        plan_placement,
    )
    from merlin_models_de.tables import feature_order

    tables = tables_from_schema(synthetic_schema("music-streaming"), dim=8)
    features = feature_order(tables)
    names = [t.name for t in tables]
    ours = make_plan(tables, 2, strategy="memory_balanced")
    table_map = [names.index(f.table) for f in features]
    assert len(set(table_map)) < len(table_map)  # a table read by two features
    theirs = de_placement(de_strategy(ours, tables, table_map), names, 2)
    assert theirs == plan_placement(ours)
