"""The placement strategies (planner/strategies.py) on hand-checked inputs: which slices each
rank gets, and the error for an unknown strategy. Pure Python."""

import pytest

from merlin_models_de.planner.strategies import (
    STRATEGIES,
    assign,
    basic,
    memory_balanced,
    memory_optimized,
    work_balanced,
)

IDS = [0, 1, 2, 3, 4]
SIZES = [50, 40, 30, 20, 10]


def test_basic_deals_round_robin_in_table_order():
    assert basic(IDS, SIZES, 2) == [[0, 2, 4], [1, 3]]


def test_memory_balanced_deals_largest_first_in_a_snake():
    assert memory_balanced(IDS, SIZES, 2) == [[0, 4, 3], [1, 2]]  # 0 1 | 2 3 back | 4


def test_memory_optimized_gives_each_slice_to_the_emptiest_rank():
    placed = memory_optimized(IDS, SIZES, 2)
    loads = sorted(sum(SIZES[i] for i in rank) for rank in placed)
    assert loads == [70, 80]  # greedy: 50 | 40, 30 -> 70 | 20 -> 70 | 10 -> 80
    assert sorted(i for rank in placed for i in rank) == IDS


def test_work_balanced_evens_the_work_not_the_bytes():
    costs = [1.0, 1.0, 1.0, 1.0, 8.0]  # the smallest table is read the most
    placed = work_balanced(IDS, SIZES, costs, 2, bound=10**6)
    work = sorted(sum(costs[i] for i in rank) for rank in placed)
    assert work == [4.0, 8.0]
    assert sorted(i for rank in placed for i in rank) == IDS


def test_work_balanced_keeps_each_rank_within_the_bound():
    sizes, costs = [60, 60, 10, 10], [3.0, 3.0, 1.0, 5.0]

    def loads(bound):
        placed = work_balanced([0, 1, 2, 3], sizes, costs, 2, bound)
        return sorted(sum(sizes[i] for i in rank) for rank in placed)

    assert loads(10**6) == [20, 120]  # by cost alone: 3 + 3 | 1 + 5
    assert loads(75) == [70, 70]  # the bound splits the two big slices


def test_every_strategy_places_every_slice_once_and_unknown_ones_are_named():
    for strategy in STRATEGIES:
        if strategy == "work_balanced":
            continue  # takes the step's costs: above
        placed = assign(strategy, IDS, SIZES, 3)
        assert len(placed) == 3 and sorted(i for r in placed for i in r) == IDS
    with pytest.raises(ValueError, match="'fastest'"):
        assign("fastest", IDS, SIZES, 2)
