"""The placement planner: tables + world size + options -> ShardingPlan (pure Python).

Example:
    >>> from merlin_models_de.tables import TableSpec, FeatureSpec
    >>> ts = [TableSpec(n, 100, 8, (FeatureSpec(n, n),)) for n in "abc"]
    >>> [(s.table, s.rank) for s in plan(ts, 2).shards]
    [('a', 0), ('c', 0), ('b', 1)]
"""

from __future__ import annotations

from typing import Mapping, Sequence

from merlin_models_de.planner.hotness import check_hotness
from merlin_models_de.planner.options import PlacementOptions, from_keywords
from merlin_models_de.planner.slicing import (
    auto_column_threshold,
    classify,
    column_slice_widths,
    row_ranges,
)
from merlin_models_de.planner.strategies import (
    MEMORY_SLACK,
    STRATEGIES,
    assign,
    memory_optimized,
    work_balanced,
)
from merlin_models_de.planner.types import (
    MODEL_PARALLEL,
    OPTIMIZER_SLOTS,
    ROW_SLOTS,
    Shard,
    ShardingPlan,
    ShardingType,
    optimizer_slots,
    row_slots,
)
from merlin_models_de.tables import TableSpec, feature_order

__all__ = [
    "plan",
    "placed_like",
    "MODEL_PARALLEL",
    "validate_options",
    "PlacementOptions",
    "Shard",
    "ShardingPlan",
    "ShardingType",
    "STRATEGIES",
    "OPTIMIZER_SLOTS",
    "ROW_SLOTS",
    "optimizer_slots",
    "row_slots",
]


def _check_world_size(world_size) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1. Received: world_size={world_size!r}")


def validate_options(
    world_size=1,
    strategy="basic",
    column_slice_threshold=None,
    row_slice_threshold=None,
    data_parallel_threshold=None,
) -> None:
    """Raises ValueError naming the first invalid placement option and its value: the world
    size, then what :class:`PlacementOptions` checks."""
    _check_world_size(world_size)
    PlacementOptions(strategy, column_slice_threshold, row_slice_threshold, data_parallel_threshold)


def _work_balanced(tables, mp, widths, sizes, world_size, room, workload) -> list[list[int]]:
    """``work_balanced``'s dealing of the slices (``widths``, ``sizes``): each slice costs
    what serving it costs its owner on ``workload`` (``planner.work.Workload``)."""
    costs = [workload.slice_ms(tables[i], w, world_size) for i in mp for w in widths[i]]
    slices = list(range(len(sizes)))
    loads = [sum(sizes[k] for k in r) for r in memory_optimized(slices, sizes, world_size)]
    bound = int(max(loads, default=0) * (1 + MEMORY_SLACK)) if room is None else room
    ids = [i for i in mp for _ in widths[i]]
    return work_balanced(ids, sizes, costs, world_size, bound)


def _room(tables, dp, rs, world_size, max_rank_elements) -> int | None:
    """Model-parallel elements a rank may hold under ``max_rank_elements``: less the replicated
    tables and the largest row slices (None: no budget)."""
    if max_rank_elements is None:
        return None
    return max_rank_elements - _fixed_elements(tables, dp, rs, world_size)


def _model_parallel_shards(
    tables, mp, world_size, strategy, threshold, room=None, workload=None
) -> list[list[Shard]]:
    if threshold is None:
        threshold = auto_column_threshold([tables[i].elements for i in mp], world_size)
    widths = {
        i: column_slice_widths(tables[i].rows, tables[i].dim, threshold, world_size) for i in mp
    }
    ids = [i for i in mp for _ in widths[i]]
    sizes = [tables[i].rows * w for i in mp for w in widths[i]]
    if strategy == "work_balanced":
        dealt = _work_balanced(tables, mp, widths, sizes, world_size, room, workload)
    else:
        dealt = assign(strategy, ids, sizes, world_size)
    # Slices of a table are handed out in rank order, so lower ranks hold lower columns;
    # several slices of one table on one rank merge into one contiguous shard.
    next_slice = {i: 0 for i in mp}
    next_col = {i: 0 for i in mp}
    per_rank: list[list[Shard]] = []
    for rank, rank_ids in enumerate(dealt):
        counts: dict[int, int] = {}
        for i in rank_ids:
            counts[i] = counts.get(i, 0) + 1
        shards = []
        for i, count in counts.items():
            k = next_slice[i]
            cols = sum(widths[i][k : k + count])
            kind = ShardingType.TABLE_WISE if len(widths[i]) == 1 else ShardingType.COLUMN_WISE
            shards.append(Shard(tables[i].name, rank, kind, 0, tables[i].rows, next_col[i], cols))
            next_slice[i] += count
            next_col[i] += cols
        per_rank.append(shards)
    return per_rank


def _all_shards(tables, dp, rs, mp_shards, world_size) -> list[Shard]:
    """Rank by rank: the replicated tables, the model-parallel shards, the row slices."""
    shards: list[Shard] = []
    for rank in range(world_size):
        shards += [
            Shard(t.name, rank, ShardingType.DATA_PARALLEL, 0, t.rows, 0, t.dim)
            for t in (tables[i] for i in dp)
        ]
        shards += mp_shards[rank]
        for i in rs:
            start, count = row_ranges(tables[i].rows, world_size)[rank]
            shards.append(
                Shard(tables[i].name, rank, ShardingType.ROW_WISE, start, count, 0, tables[i].dim)
            )
    return shards


def _fullest(shards) -> int:
    """The elements of the rank holding the most."""
    per_rank: dict[int, int] = {}
    for s in shards:
        per_rank[s.rank] = per_rank.get(s.rank, 0) + s.elements
    return max(per_rank.values(), default=0)


def _least_fullest(tables, dp, mp, rs, world_size, threshold) -> int:
    """The fullest rank's elements when the same slices are dealt largest first to the
    emptiest rank (``memory_optimized``), counted as ``work_balanced``'s bound counts them:
    every replicated table and the largest row slices, plus the fullest model-parallel load.
    ``work_balanced`` keeps any ``max_rank_elements`` at or above it."""
    fixed = _fixed_elements(tables, dp, rs, world_size)
    dealt = _model_parallel_shards(tables, mp, world_size, "memory_optimized", threshold)
    return fixed + max((sum(s.elements for s in r) for r in dealt), default=0)


def _fixed_elements(tables, dp, rs, world_size) -> int:
    """Elements every placement puts on its fullest rank before the model-parallel slices:
    the replicated tables and the largest row slice of each row-sliced table."""
    rows = sum(row_ranges(tables[i].rows, world_size)[0][1] * tables[i].dim for i in rs)
    return sum(tables[i].elements for i in dp) + rows


def _over_cap(cap: int, strategy: str, fullest: int, least: int, world_size: int) -> str:
    """The error of a placement whose fullest rank holds more than ``max_rank_elements``."""
    if least <= cap:  # another strategy keeps to it
        fix = f"use strategy='work_balanced', which keeps to max_rank_elements >= {least}"
    else:
        fix = (
            f"raise max_rank_elements to at least {least}, use more ranks, or slice the "
            "tables finer (column_slice_threshold, row_slice_threshold)"
        )
    return (
        f"Strategy '{strategy}' puts {fullest} elements on its fullest rank, above "
        f"max_rank_elements; the smallest per-rank maximum the planner reaches with these "
        f"tables on {world_size} ranks is {least} elements. To fit, {fix}. "
        f"Received: max_rank_elements={cap}"
    )


def plan(
    tables: Sequence[TableSpec],
    world_size: int,
    placement: PlacementOptions | str | None = None,
    **options,
) -> ShardingPlan:
    """Places tables on ranks. Pure: same inputs, same plan, on every rank.

    Args:
        tables: Table specs (see :func:`merlin_models_de.tables.tables_from_schema`).
        world_size: Number of ranks.
        placement: The options (:class:`PlacementOptions`, whose fields are below); a
            strategy name is short for ``PlacementOptions(strategy=name)``.
        **options: :class:`PlacementOptions`' fields as keywords, in place of a
            ``placement`` object (a keyword with an object raises ValueError naming both).

    The options:
        strategy: ``basic`` (round robin in table order), ``memory_balanced`` (largest first,
            snake order), ``memory_optimized`` (largest first, to the least-loaded rank) or
            ``work_balanced`` (the smallest busiest rank's predicted step time,
            ``planner.work``, with no rank above ``memory_optimized``'s fullest by more
            than ``strategies.MEMORY_SLACK``, or above ``max_rank_elements``).
        column_slice_threshold: Tables with more elements are cut into power-of-two column
            slices (at most ``min(world_size, dim)``). None: slice only when there are fewer
            model-parallel tables than ranks.
        row_slice_threshold: Tables with at least this many elements are split by rows
            across all ranks.
        data_parallel_threshold: Tables with at most this many elements are replicated.
        batch_size, hotness, optimizer, link: The step ``work_balanced`` predicts: samples
            per rank, mean ids per sample of multi-hot features (one number or a dict by
            feature; default: what the feature's schema declares, ``FeatureSpec.hotness``,
            else ``hotness.DEFAULT_MULTI_HOT``), the optimizer whose slots the
            update writes, the link (and its device) of ``planner.cost.LINKS``. Other
            strategies ignore them; the plan does not record them.
        max_rank_elements: Embedding parameters a rank may hold (every kind): no rank of
            the plan holds more, or ValueError names the smallest per-rank maximum the
            planner reaches. ``work_balanced`` places within it (in place of the bound
            relative to ``memory_optimized``); the other strategies are only checked.

    Returns:
        A frozen ShardingPlan.

    Example:
        >>> options = PlacementOptions("memory_balanced", column_slice_threshold=10**7)
        >>> p = plan(tables, 4, options)  # doctest: +SKIP
        >>> p = plan(tables, 4, "memory_balanced", column_slice_threshold=10**7)  # doctest: +SKIP
        >>> print(p.summary("adagrad"))  # doctest: +SKIP
    """
    _check_world_size(world_size)
    placement = _placement(placement, options)
    workload = placement.workload
    strategy, hotness = placement.strategy, placement.hotness
    column_slice_threshold = placement.column_slice_threshold
    row_slice_threshold = placement.row_slice_threshold
    data_parallel_threshold = placement.data_parallel_threshold
    max_rank_elements = placement.max_rank_elements
    tables = tuple(tables)
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"Table names must be unique. Received: {names}")
    check_hotness(hotness, feature_order(tables))
    dp, mp, rs = classify(tables, data_parallel_threshold, row_slice_threshold)
    for i in rs:
        if tables[i].dynamic is not None and tables[i].rows < world_size:
            raise ValueError(
                f"Dynamic table '{tables[i].name}' needs a capacity of at least one row per "
                f"rank (world_size={world_size}). Received: capacity={tables[i].rows}"
            )
        if tables[i].rows < world_size:
            raise ValueError(
                f"Table '{tables[i].name}' has {tables[i].rows} rows, fewer than "
                f"world_size={world_size}; it cannot be row sliced. Received: "
                f"row_slice_threshold={row_slice_threshold!r}"
            )
    room = _room(tables, dp, rs, world_size, max_rank_elements)
    mp_shards = _model_parallel_shards(
        tables,
        mp,
        world_size,
        strategy,
        column_slice_threshold,
        room,
        workload,
    )
    shards = _all_shards(tables, dp, rs, mp_shards, world_size)
    fullest = _fullest(shards)
    if max_rank_elements is not None and fullest > max_rank_elements:
        least = _least_fullest(tables, dp, mp, rs, world_size, column_slice_threshold)
        raise ValueError(_over_cap(max_rank_elements, strategy, fullest, least, world_size))
    return ShardingPlan(world_size, strategy, tables, tuple(shards), _recorded(placement))


def _recorded(placement: PlacementOptions) -> tuple:
    """The options that shaped the plan, so that planning again (an elastic reset's memory
    check) places the same: the thresholds always, the cap where set, and the step where the
    strategy places by it (``work_balanced``)."""
    kept = {
        "column_slice_threshold": placement.column_slice_threshold,
        "data_parallel_threshold": placement.data_parallel_threshold,
        "row_slice_threshold": placement.row_slice_threshold,
    }
    if placement.max_rank_elements is not None:
        kept["max_rank_elements"] = placement.max_rank_elements
    if placement.strategy == "work_balanced":
        step = ("batch_size", "hotness", "optimizer", "link")
        kept.update({name: getattr(placement, name) for name in step})
    return tuple(sorted(kept.items()))


def _placement(placement, options: dict) -> PlacementOptions:
    """plan()'s options as one object: ``placement`` (a strategy name: short for one) or the
    keywords; a keyword that is no option is refused as Python refuses one."""
    if isinstance(placement, str):
        if "strategy" in options:
            raise TypeError(
                f"plan() got the strategy twice. Received: placement={placement!r}, "
                f"strategy={options['strategy']!r}"
            )
        placement, options = None, {"strategy": placement, **options}
    options = dict(options)
    found = from_keywords(PlacementOptions, placement, options, "placement")
    if options:  # left: no field of PlacementOptions
        raise TypeError(f"plan() got unexpected keyword arguments {sorted(options)}")
    return found


def placed_like(plan_: ShardingPlan, table: str, companion: TableSpec) -> ShardingPlan:
    """A plan holding only ``companion`` (as many rows as ``table``), laid out exactly as
    ``table`` is in ``plan_``: the same kind, ranks and row ranges, all of its columns.

    For per-row companions of a table (a tied output's bias per item): each rank then holds
    the companion rows of exactly the table rows it holds. Column slices have no such layout.

    Example:
        >>> from merlin_models_de.tables import TableSpec, FeatureSpec
        >>> item = TableSpec("item", 10, 8, (FeatureSpec("item", "item"),))
        >>> bias = TableSpec("bias", 10, 1, (FeatureSpec("bias", "bias"),))
        >>> p = placed_like(plan([item], 2, row_slice_threshold=1), "item", bias)
        >>> [(s.rank, s.row_start, s.rows, s.cols) for s in p.shards]
        [(0, 0, 5, 1), (1, 5, 5, 1)]
    """
    spec = plan_.table(table)
    if companion.rows != spec.rows:
        raise ValueError(
            f"Table '{companion.name}' must have the {spec.rows} rows of table "
            f"'{table}' to be placed like it. Received: rows={companion.rows}"
        )
    if plan_.kind_of(table) is ShardingType.COLUMN_WISE:
        raise ValueError(
            f"Table '{table}' is column-sliced; a per-row companion "
            f"('{companion.name}') cannot be placed like it."
        )
    shards = tuple(
        Shard(companion.name, s.rank, s.kind, s.row_start, s.rows, 0, companion.dim)
        for s in plan_.shards
        if s.table == table
    )
    return ShardingPlan(plan_.world_size, plan_.strategy, (companion,), shards, plan_.options)
