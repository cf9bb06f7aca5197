"""Thresholds and slices (planner/slicing.py): which tables are replicated, row sliced or
model parallel, how many column slices a table takes, and each rank's rows. Pure Python."""

import pytest

from merlin_models_de.planner.slicing import (
    auto_column_threshold,
    classify,
    column_slice_widths,
    row_ranges,
)
from merlin_models_de.tables import FeatureSpec, TableSpec


def _table(name, rows, dim):
    return TableSpec(name, rows, dim, (FeatureSpec(name, name),))


def test_classify_replicates_small_tables_and_row_slices_large_ones():
    tables = [_table("small", 10, 4), _table("mid", 100, 4), _table("big", 1000, 4)]
    assert classify(tables, 40, 4000) == ([0], [1], [2])
    assert classify(tables, None, None) == ([], [0, 1, 2], [])
    # a table at both thresholds is replicated: the data-parallel one is read first
    assert classify(tables, 4000, 40) == ([0, 1, 2], [], [])


@pytest.mark.parametrize(
    "rows, dim, threshold, world_size, widths",
    [
        (1000, 16, 5000, 8, [4, 4, 4, 4]),  # 16000 -> 4 slices of 4000
        (1000, 16, None, 8, [16]),  # no threshold: whole
        (1000, 16, 1, 2, [8, 8]),  # capped at the world size
        (1000, 3, 1, 8, [1, 1, 1]),  # capped at the dim
        (10, 7, 30, 4, [2, 2, 2, 1]),  # the first dim % n slices one wider
    ],
)
def test_column_slices_are_a_power_of_two_capped_and_cover_the_dim(
    rows, dim, threshold, world_size, widths
):
    assert column_slice_widths(rows, dim, threshold, world_size) == widths


def test_auto_threshold_gives_every_rank_a_slice_only_when_tables_are_too_few():
    assert auto_column_threshold([100, 50, 50], 2) is None
    threshold = auto_column_threshold([100], 4)
    assert threshold == 49  # 100 -> 50 + 50 -> 25 * 4: three halvings, the last of a 50
    assert len(column_slice_widths(10, 10, threshold, 4)) == 4


def test_row_ranges_cover_every_row_once_first_ranks_one_more():
    assert row_ranges(10, 3) == [(0, 4), (4, 3), (7, 3)]
    assert row_ranges(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]
