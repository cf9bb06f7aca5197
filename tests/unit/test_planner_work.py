"""The work_balanced strategy and the per-rank step estimate (planner/work.py): exact
placements, the memory bound, determinism, Criteo on 2 ranks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_models_de.planner import plan
from merlin_models_de.planner.strategies import MEMORY_SLACK, memory_optimized, work_balanced
from merlin_models_de.planner.work import COMPUTE, Compute, busiest_ms, rank_times, serve_ms
from merlin_models_de.tables import FeatureSpec, TableSpec, tables_from_schema


def specs(*shapes):
    """TableSpecs t0, t1, ... of the given (rows, dim)."""
    return [
        TableSpec(f"t{i}", r, d, (FeatureSpec(f"t{i}", f"t{i}"),))
        for i, (r, d) in enumerate(shapes)
    ]


def names(p, rank):
    return [s.table for s in p.shards_on(rank)]


# Criteo's shape in small: four large tables, a middle one, 21 small ones. memory_optimized
# deals 1000 -> A, 1000 -> B, 1000 -> A, 1000 -> B, 400 -> A (2400), then every small table
# to B (2210 < 2400): A serves 3 lookups, B 23.
CRITEO_LIKE = specs(*([(1000, 1)] * 4 + [(400, 1)] + [(10, 1)] * 21))


def test_memory_optimized_serves_most_lookups_on_one_rank():
    p = plan(CRITEO_LIKE, 2, "memory_optimized", batch_size=4)
    assert sorted(len(p.shards_on(r)) for r in range(2)) == [3, 23]
    assert sorted(p.rank_elements(r) for r in range(2)) == [2210, 2400]


def test_work_balanced_exact_placement_on_the_criteo_like_case():
    # 8 ids per lookup, every table has at least 8 rows and width 1: every lookup costs the
    # same. Largest cost first (ties: larger, then lower id), to the rank with the least cost
    # (ties: fewer elements, then the lower rank) under the bound int(2400 * 1.05) = 2520:
    # t0 A, t1 B, t2 A, t3 B, t4 A (2400); t5 B, t6 B (same cost, fewer elements), then the
    # small ones alternate from t7 on A: A 2400 + 10 x 10 = 2500, B 2000 + 11 x 10 = 2110.
    p = plan(CRITEO_LIKE, 2, "work_balanced", batch_size=4)
    assert names(p, 0) == ["t0", "t2", "t4"] + [f"t{i}" for i in range(7, 26, 2)]
    assert names(p, 1) == ["t1", "t3", "t5", "t6"] + [f"t{i}" for i in range(8, 25, 2)]
    assert [p.rank_elements(r) for r in range(2)] == [2500, 2110]
    assert p.rank_elements(0) <= int(2400 * (1 + MEMORY_SLACK))
    times = rank_times(p, 4)
    assert [t.lookups for t in times] == [13, 13]
    mo = rank_times(plan(CRITEO_LIKE, 2, "memory_optimized", batch_size=4), 4)
    assert busiest_ms(times) < busiest_ms(mo)


def test_an_explicit_budget_replaces_the_bound():
    # 2450 elements: A can take only 5 small tables more; B serves the rest
    p = plan(CRITEO_LIKE, 2, "work_balanced", batch_size=4, max_rank_elements=2450)
    assert max(p.rank_elements(r) for r in range(2)) <= 2450
    assert sorted(len(p.shards_on(r)) for r in range(2)) == [8, 18]


def test_the_bound_decides_where_cost_alone_would_not():
    ids, sizes, costs = [0, 1, 2, 3], [60, 60, 50, 10], [1.0, 1.0, 1.0, 3.0]
    # unbounded: slice 3 alone (cost 3) against the other three (cost 3)
    assert work_balanced(ids, sizes, costs, 2, 1000) == [[3], [0, 1, 2]]
    # memory_optimized's busiest holds 110, so at most 115: 3 -> A, 0 -> B, 1 does not fit
    # on B (120) -> A (cost 4), 2 -> B (110); no move or swap lowers A's 4 within 115
    assert memory_optimized(ids, sizes, 2) == [[1, 3], [0, 2]]
    assert work_balanced(ids, sizes, costs, 2, 115) == [[1, 3], [0, 2]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 10_000), st.floats(0.0, 10.0)), min_size=1, max_size=14),
    st.integers(1, 6),
)
def test_no_rank_above_the_bound_and_never_busier_than_memory_optimized(slices, n):
    sizes, costs = [s for s, _ in slices], [c for _, c in slices]
    ids = list(range(len(slices)))
    by_memory = memory_optimized(ids, sizes, n)
    bound = int(max(sum(sizes[k] for k in r) for r in by_memory) * (1 + MEMORY_SLACK))
    dealt = work_balanced(ids, sizes, costs, n, bound)
    assert sorted(k for r in dealt for k in r) == ids
    assert max(sum(sizes[k] for k in r) for r in dealt) <= bound
    busiest = max(sum(costs[k] for k in r) for r in dealt)
    assert busiest <= max(sum(costs[k] for k in r) for r in by_memory) + 1e-9
    assert work_balanced(ids, sizes, costs, n, bound) == dealt  # deterministic


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_criteo_lookups_even_and_bytes_within_the_bound(synthetic_schema, world_size):
    tables = tables_from_schema(synthetic_schema("criteo"), dim=16)
    mo = plan(tables, world_size, "memory_optimized")
    wb = plan(tables, world_size, "work_balanced")
    assert wb == plan(tables, world_size, "work_balanced")
    bound = max(mo.rank_elements(r) for r in range(world_size)) * (1 + MEMORY_SLACK)
    assert max(wb.rank_elements(r) for r in range(world_size)) <= bound
    served = [t.lookups for t in rank_times(wb)]
    assert max(served) - min(served) <= 1
    assert busiest_ms(rank_times(wb)) < busiest_ms(rank_times(mo))


def test_criteo_two_ranks_thirteen_lookups_each(synthetic_schema):
    tables = tables_from_schema(synthetic_schema("criteo"), dim=16)
    mo, wb = plan(tables, 2, "memory_optimized"), plan(tables, 2, "work_balanced")
    assert sorted(t.lookups for t in rank_times(mo)) == [3, 23]
    assert [t.lookups for t in rank_times(wb)] == [13, 13]


def test_the_estimate_adds_compute_and_exchanges():
    compute = Compute(lookup_ms=0.5, element_ns=1.0, update_ns=1.0)
    # 2 ranks x 4 ids, 8 columns, 100 rows, one copy: 0.5 + (8*8 + 8*8) ns
    assert compute.lookup(8, 8, 100, 1) == pytest.approx(0.5 + 128e-6)
    tables = specs((100, 8), (100, 8), (100, 8))
    times = rank_times(plan(tables, 2), 4, link="nvlink-nccl", optimizer="sgd")
    assert [t.lookups for t in times] == [2, 1]
    gpu = COMPUTE["nvlink-nccl"]
    assert times[0].compute_ms == pytest.approx(2 * gpu.lookup(8, 8, 100, 1))
    adagrad = rank_times(plan(tables, 2), 4, link="nvlink-nccl")  # the default: 2 copies
    assert adagrad[0].compute_ms == pytest.approx(2 * gpu.lookup(8, 8, 100, 2))
    assert all(t.comm_ms > 0 for t in times)
    one = rank_times(plan(tables, 1), 4)
    assert one[0].lookups == 3 and one[0].comm_ms == 0
    # serving a lookup costs its compute plus its off-rank bytes; pooled: a row per sample
    assert serve_ms(4, 8, 100, 2, 1, "nvlink-nccl") > gpu.lookup(8, 8, 100, 1)
    pooled = serve_ms(40, 8, 100, 2, 1, "nvlink-nccl", out_rows=4)
    assert gpu.lookup(80, 8, 100, 1) < pooled < serve_ms(40, 8, 100, 2, 1, "nvlink-nccl")


def test_multi_hot_features_count_their_hotness():
    t = TableSpec("m", 10_000, 4, (FeatureSpec("m", "m", multi_hot=True, combiner="sum"),))
    u = TableSpec("u", 10_000, 4, (FeatureSpec("u", "u"),))
    default = rank_times(plan([t, u], 1), 16)[0].compute_ms
    hot = rank_times(plan([t, u], 1), 16, hotness={"m": 20.0})[0].compute_ms
    assert hot > default


def test_a_missing_hotness_reads_the_same_default_in_placement_step_and_bytes():
    from merlin_models_de.planner.cost import step_costs
    from merlin_models_de.planner.hotness import DEFAULT_MULTI_HOT

    multi = [
        TableSpec(f"m{i}", 1000, 8, (FeatureSpec(f"m{i}", f"m{i}", True, "sum"),)) for i in range(3)
    ]
    tables = multi + specs((1000, 8), (1000, 8))
    p = plan(tables, 2, "work_balanced", batch_size=64, hotness=DEFAULT_MULTI_HOT)
    for value in (None, {}, {"m0": None}):
        # the same placement (the plans record the hotness each was given)
        assert plan(tables, 2, "work_balanced", batch_size=64, hotness=value).shards == p.shards
        assert rank_times(p, 64, hotness=value) == rank_times(p, 64, hotness=DEFAULT_MULTI_HOT)
        assert step_costs(p, 64, hotness=value) == step_costs(p, 64, hotness=DEFAULT_MULTI_HOT)
    # and the default is a real number of ids: another one changes the estimate
    assert rank_times(p, 64) != rank_times(p, 64, hotness=1.0)


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(batch_size=0), "Received: batch_size=0"),
        (dict(hotness=-1.0), "Received: hotness=-1.0"),
        (dict(hotness={"t0": "x"}), "hotness of feature 't0' must be a number >= 0"),
        (dict(optimizer="nadam2"), "Received: optimizer='nadam2'"),
        (dict(link="carrier-pigeon"), "Received: link='carrier-pigeon'"),
        (dict(max_rank_elements=0), "max_rank_elements=0"),
    ],
)
def test_bad_workload_options_name_the_option(option, message):
    with pytest.raises(ValueError, match=message):
        plan(specs((10, 1)), 2, "work_balanced", **option)


def test_distributed_embeddings_refuses_strategies_it_cannot_place():
    pytest.importorskip("tensorflow")
    from merlin_models_de.backends.distributed_embeddings import DistributedEmbeddingsBackend
    from merlin_models_de.tables import feature_order

    p = plan(specs((10, 1), (20, 1)), 2, "work_balanced")
    with pytest.raises(ValueError, match="Received: strategy='work_balanced'"):
        DistributedEmbeddingsBackend(p, feature_order(p.tables), 0)


def test_auto_picks_horovod_for_our_own_strategies(monkeypatch):
    from merlin_models_de.backends import registry

    monkeypatch.setattr(registry, "is_importable", lambda name: True)
    assert registry.resolve("auto", (), None, strategy="work_balanced") == "horovod"
    assert (
        registry.resolve("auto", (), None, strategy="memory_optimized") == "distributed-embeddings"
    )
    assert registry.resolve("auto", (), None, "bfloat16", strategy="memory_optimized") == "horovod"
