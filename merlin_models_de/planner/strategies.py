"""Placement strategies: deal slices (each a table id with a size) to ranks.

Each function is pure and deterministic; ties are broken by table id so every rank computes
the same answer. The orders match NVIDIA distributed-embeddings' strategies of the same
names, so both backends place the same table on the same rank.

Example:
    >>> basic([0, 1, 2], [5, 9, 1], 2)
    [[0, 2], [1]]
"""

from __future__ import annotations

STRATEGIES = ("basic", "memory_balanced", "memory_optimized")


def basic(ids: list[int], sizes: list[int], world_size: int) -> list[list[int]]:
    """Round robin in table order: slice k goes to rank ``k % world_size``.

    Example:
        >>> basic([0, 0, 1], [4, 4, 8], 2)
        [[0, 1], [0]]
    """
    del sizes
    return [ids[rank::world_size] for rank in range(world_size)]


def memory_balanced(ids: list[int], sizes: list[int], world_size: int) -> list[list[int]]:
    """Largest first, dealt in a snake: ranks 0..N-1, then N-1..0, and so on.

    Every rank gets the same number of slices (plus or minus one) and similar bytes.
    Each rank lists its forward-pass picks first, then its backward-pass picks.

    Example:
        >>> memory_balanced([0, 1, 2, 3], [1, 2, 3, 4], 2)
        [[3, 0], [2, 1]]
    """
    order = [i for _, i in sorted(zip(sizes, ids), reverse=True)]
    step = 2 * world_size
    return [order[r::step] + order[step - 1 - r :: step] for r in range(world_size)]


def memory_optimized(ids: list[int], sizes: list[int], world_size: int) -> list[list[int]]:
    """Largest first, each slice to the rank holding the fewest elements so far.

    Bytes are as even as greedy placement gets; slice counts may differ. Ranks are numbered
    by ascending final load (ties by their slice lists), as distributed-embeddings does.

    Example:
        >>> memory_optimized([0, 1, 2], [10, 6, 5], 2)
        [[0], [1, 2]]
    """
    pending = sorted(zip(sizes, ids))
    buckets: list[tuple[int, list[int]]] = [(0, []) for _ in range(world_size)]
    while pending:
        size, table = pending.pop()
        load, members = buckets[0]
        buckets[0] = (load + size, members + [table])
        buckets.sort()
    return [members for _, members in buckets]


def assign(strategy: str, ids: list[int], sizes: list[int], world_size: int) -> list[list[int]]:
    """Dispatches to the named strategy. Raises ValueError naming an unknown one."""
    funcs = {
        "basic": basic,
        "memory_balanced": memory_balanced,
        "memory_optimized": memory_optimized,
    }
    if strategy not in funcs:
        raise ValueError(
            f"Unknown strategy; expected one of {list(STRATEGIES)}. "
            f"Received: strategy={strategy!r}"
        )
    return funcs[strategy](list(ids), list(sizes), world_size)
