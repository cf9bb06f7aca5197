"""Re-homing a restored key map (merlin_models_de/dynamic/rehome.py): a share over capacity
keeps what its policy keeps, exactly; kept keys stay in their slots where they have one."""

import numpy as np
import pytest

from merlin_models_de import DynamicTable
from merlin_models_de.dynamic.rehome import candidate_rows, eviction_order, rehome


def test_lfu_evicts_the_lowest_count_then_last_step_and_counts_them():
    counts = [5, 1, 3, 1, 9, 2]
    seen = [4, 7, 2, 3, 1, 8]
    homes = [-1, 2, 0, -1, -1, 3]
    slots, evicted = rehome(counts, seen, homes, rows=4, policy="lfu")
    # (1, 3) and (1, 7) go first; the others keep their homes or take the free slots 1, 2
    assert evicted == 2
    assert slots.tolist() == [1, -1, 0, -1, 2, 3]


@pytest.mark.parametrize("policy", ["lru", "ttl", None])
def test_lru_ttl_and_never_give_up_the_least_recently_used(policy):
    slots, evicted = rehome([9, 1, 1], [1, 5, 3], [-1, -1, -1], rows=1, policy=policy)
    assert (slots.tolist(), evicted) == ([-1, 0, -1], 2)


def test_ties_go_to_the_earlier_entry():
    order = eviction_order(np.array([2, 2, 2]), np.array([4, 4, 4]), "lfu")
    assert order.tolist() == [0, 1, 2]
    slots, evicted = rehome([2, 2, 2], [4, 4, 4], [-1, -1, -1], rows=2, policy="lfu")
    assert (slots.tolist(), evicted) == ([-1, 0, 1], 1)


def test_counts_above_the_score_cap_tie_as_the_map_scores_them():
    big = 2**31 + 5  # above the map's cap on an lfu score's halves: equal to 2**31 - 1
    order = eviction_order(np.array([big, 2**31 - 1]), np.array([1, 1]), "lfu")
    assert order.tolist() == [0, 1]


def test_within_capacity_every_entry_keeps_its_home():
    slots, evicted = rehome([1, 1, 1], [1, 1, 1], [4, -1, 0], rows=5, policy="lfu")
    assert (slots.tolist(), evicted) == ([4, 1, 0], 0)


def test_nothing_to_place():
    slots, evicted = rehome([], [], [], rows=3, policy="lfu")
    assert (slots.tolist(), evicted) == ([], 0)


def test_candidate_rows_follow_the_key_map():
    assert candidate_rows(DynamicTable(capacity=10), 5) == 0  # admitted at once: no store
    assert candidate_rows(DynamicTable(capacity=10, admit_after=2), 5) == 5
    assert candidate_rows(DynamicTable(capacity=10, admit_after=2, candidates=3), 5) == 3
