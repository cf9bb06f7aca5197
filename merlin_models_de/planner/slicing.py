"""Column slicing, data-parallel and row-slice thresholds (pure Python).

Example:
    >>> column_slice_widths(rows=1000, dim=16, threshold=5000, world_size=8)
    [4, 4, 4, 4]
"""

from __future__ import annotations

from typing import Sequence

from merlin_models_de.tables import TableSpec


def classify(
    tables: Sequence[TableSpec],
    data_parallel_threshold: int | None,
    row_slice_threshold: int | None,
) -> tuple[list[int], list[int], list[int]]:
    """Splits table indices into (data-parallel, model-parallel, row-sliced).

    A dynamic table is split by rows (each rank owns the keys that hash to it). A table with
    at most ``data_parallel_threshold`` elements is replicated; otherwise one with at least
    ``row_slice_threshold`` elements is split by rows; the rest are model parallel.
    """
    dp, mp, rs = [], [], []
    for i, t in enumerate(tables):
        if t.dynamic is not None:
            rs.append(i)
        elif data_parallel_threshold and t.elements <= data_parallel_threshold:
            dp.append(i)
        elif row_slice_threshold and t.elements >= row_slice_threshold:
            rs.append(i)
        else:
            mp.append(i)
    return dp, mp, rs


def auto_column_threshold(sizes: Sequence[int], world_size: int) -> int | None:
    """With fewer tables than ranks, the threshold that halves the largest tables until
    every rank can get a slice; None when there are enough tables."""
    threshold = None
    pool = list(sizes)
    while pool and world_size > len(pool):
        pool.sort()
        largest = pool.pop()
        threshold = largest - 1
        pool += [largest // 2, largest // 2]
    return threshold


def column_slice_widths(rows: int, dim: int, threshold: int | None, world_size: int) -> list[int]:
    """Widths of the column slices of one table.

    The smallest power-of-two number of slices that brings each under ``threshold`` elements,
    capped at ``min(world_size, dim)``; the first ``dim % n`` slices are one column wider.
    """
    n, size, cap = 1, float(rows * dim), max(1, min(world_size, dim))
    # stop at the cap: more halving cannot change the result, and a threshold below one
    # element (auto threshold of a 1x1 table) would otherwise never end
    while threshold is not None and size > threshold and n < cap:
        n, size = n * 2, size / 2
    n = min(n, cap)
    base, extra = divmod(dim, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def row_ranges(rows: int, world_size: int) -> list[tuple[int, int]]:
    """``(row_start, rows)`` of each rank's row slice; the first ``rows % N`` get one more."""
    base, extra = divmod(rows, world_size)
    out, start = [], 0
    for rank in range(world_size):
        count = base + (1 if rank < extra else 0)
        out.append((start, count))
        start += count
    return out
