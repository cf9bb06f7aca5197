"""Placement strategies: deal slices (each a table id with a size) to ranks.

Each function is pure and deterministic; ties are broken by table id so every rank computes
the same answer. The orders match NVIDIA distributed-embeddings' strategies of the same
names, so both backends place the same table on the same rank.

Example:
    >>> basic([0, 1, 2], [5, 9, 1], 2)
    [[0, 2], [1]]
"""

from __future__ import annotations

STRATEGIES = ("basic", "memory_balanced", "memory_optimized", "work_balanced")
# the strategies NVIDIA distributed-embeddings places with itself (the others are ours only)
NVIDIA_STRATEGIES = ("basic", "memory_balanced", "memory_optimized")
# work_balanced keeps every rank within this share above memory_optimized's busiest rank
MEMORY_SLACK = 0.05
MAX_MOVES = 256  # improving moves work_balanced makes at most from each start


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


def _totals(owner: list[int], sizes, costs, world_size: int) -> tuple[list[float], list[int]]:
    """Per rank, the cost and the elements of the slices ``owner`` gives it."""
    time, load = [0.0] * world_size, [0] * world_size
    for k, r in enumerate(owner):
        time[r] += costs[k]
        load[r] += sizes[k]
    return time, load


def _improve(owner: list[int], sizes, costs, world_size: int, bound: int) -> list[int]:
    """Moves and swaps of one slice between the busiest rank and another while they lower
    the busier of the two's cost, never above ``bound`` elements. Deterministic."""
    owner = list(owner)
    for _ in range(min(4 * len(owner) + 4, MAX_MOVES)):
        time, load = _totals(owner, sizes, costs, world_size)
        busiest = max(range(world_size), key=lambda r: (time[r], -r))
        best = None  # (pair max, slice on busiest, other rank, slice moved back or -1)
        for k in (k for k, r in enumerate(owner) if r == busiest):
            for other in range(world_size):
                if other == busiest:
                    continue
                back = [-1] + [j for j, r in enumerate(owner) if r == other]
                for j in back:
                    dc = costs[k] - (costs[j] if j >= 0 else 0.0)
                    ds = sizes[k] - (sizes[j] if j >= 0 else 0)
                    if dc <= 0 or load[other] + ds > bound or load[busiest] - ds > bound:
                        continue
                    pair = max(time[busiest] - dc, time[other] + dc)
                    if pair < time[busiest] * (1 - 1e-9) and (best is None or pair < best[0]):
                        best = (pair, k, other, j)
        if best is None:
            return owner
        _, k, other, j = best
        owner[k] = other
        if j >= 0:
            owner[j] = busiest
    return owner


def work_balanced(
    ids: list[int], sizes: list[int], costs: list[float], world_size: int, bound: int
) -> list[list[int]]:
    """Slices to ranks so that the busiest rank's cost (predicted milliseconds) is small and no
    rank holds more than ``bound`` elements (unless one slice alone is larger).

    Two starts, each improved by moves and swaps between the busiest rank and another
    (:func:`_improve`): the largest cost first, to the rank with the least cost where it
    fits; and :func:`memory_optimized`'s placement. The start whose result has the smaller
    busiest cost wins (then fewer elements on the fullest rank). Each rank lists its slices in
    slice order.

    Example:
        >>> work_balanced([0, 1, 2, 3], [90, 90, 1, 1], [1.0, 1.0, 1.0, 1.0], 2, 100)
        [[0, 2], [1, 3]]
    """
    n, slices = world_size, range(len(ids))
    greedy, time, load = [0] * len(ids), [0.0] * n, [0] * n
    for k in sorted(slices, key=lambda k: (-costs[k], -sizes[k], ids[k], k)):
        fits = [r for r in range(n) if load[r] + sizes[k] <= bound] or range(n)
        r = min(fits, key=lambda r: (time[r], load[r], r))
        greedy[k], time[r], load[r] = r, time[r] + costs[k], load[r] + sizes[k]
    by_memory = [0] * len(ids)
    for rank, members in enumerate(memory_optimized(list(slices), list(sizes), n)):
        for k in members:
            by_memory[k] = rank

    def score(owner):  # within the bound first, then the busiest cost, then the fullest
        time, load = _totals(owner, sizes, costs, n)
        return (max(load) > bound, max(time), max(load))

    best = min((_improve(o, sizes, costs, n, bound) for o in (greedy, by_memory)), key=score)
    return [[ids[k] for k in slices if best[k] == r] for r in range(n)]


def assign(strategy: str, ids: list[int], sizes: list[int], world_size: int) -> list[list[int]]:
    """Dispatches to the named memory strategy (``work_balanced`` needs costs: see
    :func:`work_balanced`). Raises ValueError naming an unknown one."""
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
