"""The planner's inputs: every bad value fails in plan() (pure Python, before any variable),
naming the option, table or feature and the value."""

import pytest

from merlin_models_de.apps.common.hotness import parse_hotness
from merlin_models_de.planner import plan
from merlin_models_de.planner.cost import step_costs
from merlin_models_de.tables import FeatureSpec, TableSpec


def multi_hot(*shapes):
    """Tables t0, t1, ... of the given (rows, dim), each read by one pooled multi-hot feature."""
    return [
        TableSpec(f"t{i}", r, d, (FeatureSpec(f"t{i}", f"t{i}", True, "sum"),))
        for i, (r, d) in enumerate(shapes)
    ]


def test_infinite_hotness_is_named():
    tables = multi_hot((100, 8), (50, 8))
    inf = float("inf")
    for hotness, named in ((inf, "hotness=inf"), ({"t0": inf}, "hotness of feature 't0'")):
        with pytest.raises(ValueError, match=named):  # was an OverflowError naming nothing
            plan(tables, 2, "work_balanced", hotness=hotness)


def test_hotness_naming_a_feature_the_tables_lack_is_refused():
    tables = multi_hot((100, 8), (50, 8))
    with pytest.raises(ValueError, match=r"do not have: \['t00'\].*Received: hotness="):
        plan(tables, 2, "work_balanced", hotness={"t00": 30.0})  # misspelt t0
    p = plan(tables, 2, "basic")
    with pytest.raises(ValueError, match=r"\['t00'\]"):
        step_costs(p, 8, hotness={"t00": 30.0})
    # every key known: planned (a one-hot feature's value is read as 1 id)
    assert plan(tables, 2, "work_balanced", hotness={"t0": 30.0, "t1": 2}).world_size == 2


@pytest.mark.parametrize("text", ["inf", "nan", "-2", "t0=inf", "t0=2,t1=-1", "=3"])
def test_the_hotness_option_takes_finite_counts_only(text):
    with pytest.raises(ValueError, match=rf"Received: --hotness={text!r}"):
        parse_hotness(text)
    assert parse_hotness("t0=2, t1=5.5") == {"t0": 2.0, "t1": 5.5}
    assert parse_hotness("0") == 0.0


def test_the_plan_command_refuses_hotness_inf(capsys):
    from merlin_models_de.apps.tools.plan import main

    assert main(["no-schema-is-read", "--hotness", "inf"]) == 2
    err = capsys.readouterr().err
    assert "Received: --hotness='inf'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "rows, dim, named", [(0, 4, "rows=0"), (-5, 4, "rows=-5"), (10, 0, "dim=0")]
)
def test_a_table_of_no_rows_or_columns_is_refused(rows, dim, named):
    with pytest.raises(ValueError, match=rf"Table 'bad' needs .*Received: {named}$"):
        TableSpec("bad", rows, dim, (FeatureSpec("bad", "bad"),))
    with pytest.raises(ValueError, match=named):  # a plan read back from JSON too
        TableSpec.from_dict({"name": "bad", "rows": rows, "dim": dim, "features": []})


def test_an_impossible_max_rank_elements_names_the_smallest_reachable():
    # slices of 800, 800 and 800 elements on 2 ranks: the fullest rank holds at least 1600
    tables = multi_hot((100, 8), (100, 8), (100, 8))
    for strategy in ("work_balanced", "basic", "memory_optimized"):
        with pytest.raises(
            ValueError,
            match=r"puts 1600 elements on its fullest rank.* reaches .* is 1600 elements.*"
            r"Received: max_rank_elements=1599$",
        ):
            plan(tables, 2, strategy, max_rank_elements=1599)
    p = plan(tables, 2, "work_balanced", max_rank_elements=1600)
    assert max(p.rank_elements(r) for r in range(2)) == 1600
    # replicated tables and row slices count on every rank
    with pytest.raises(ValueError, match=r"is 1300 elements"):
        plan(
            multi_hot((100, 8), (100, 8), (100, 5)),
            2,
            "work_balanced",
            data_parallel_threshold=500,
            max_rank_elements=1200,
        )


def test_a_strategy_over_the_cap_points_at_the_one_that_fits():
    # basic deals t0, t2 to rank 0 (1000 + 600) and t1, t3 to rank 1 (100 + 600)
    tables = multi_hot((125, 8), (25, 4), (75, 8), (75, 8))
    assert max(plan(tables, 2, "basic").rank_elements(r) for r in range(2)) == 1600
    with pytest.raises(ValueError, match=r"strategy='work_balanced', which keeps to .* >= 1200"):
        plan(tables, 2, "basic", max_rank_elements=1300)
    p = plan(tables, 2, "work_balanced", max_rank_elements=1300)
    assert max(p.rank_elements(r) for r in range(2)) <= 1300
