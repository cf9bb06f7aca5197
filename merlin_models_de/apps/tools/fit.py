"""The smallest world size whose busiest rank fits a device (the plan command's
``--device-memory``): each world size planned in one pass, from the fewest ranks that could
hold the tables at all."""

from __future__ import annotations

import math
from dataclasses import dataclass

from merlin_models_de.planner import OPTIMIZER_SLOTS, plan, row_slots
from merlin_models_de.planner.slicing import classify, column_slice_widths
from merlin_models_de.tables import human_bytes

MAX_WORLD_SIZE = 4096  # the largest world size the command plans or searches
MAX_PLANS = 128  # world sizes tried at most when looking for the smallest that fits


@dataclass(frozen=True)
class Fit:
    """What :func:`smallest_world_size` found.

    Attributes:
        world_size: The smallest world size whose busiest rank fits, or None.
        busiest_bytes: That rank's bytes with optimizer slots (None when nothing fits).
        reason: Why nothing fits, one sentence (empty when something does).
        plans: How many world sizes were planned to find out.
        checked_up_to: When nothing fits: no world size up to this one fits.
    """

    world_size: int | None
    busiest_bytes: int | None = None
    reason: str = ""
    plans: int = 0
    checked_up_to: int | None = None


def busiest_elements(
    tables,
    world_size: int,
    strategy: str = "basic",
    *,
    column_slice_threshold=None,
    row_slice_threshold=None,
    data_parallel_threshold=None,
    copies: int = 1,
    per_row: int = 0,
    **workload,
) -> int:
    """Elements on the busiest rank of ``plan(tables, world_size, ...)``, in one pass, each
    counted ``copies`` times, plus ``per_row`` values for each row the rank holds (row-wise
    optimizer state). ``workload``: the step ``work_balanced`` places for (``batch_size``,
    ``hotness``, ``optimizer``, ``link`` of :func:`merlin_models_de.planner.plan`).

    Only the model-parallel tables are planned (their placement does not depend on the
    others); replicated and row-sliced tables are added per rank from their closed forms,
    which keeps large world sizes cheap.
    """
    dp, mp, rs = classify(tables, data_parallel_threshold, row_slice_threshold)
    per_rank = [sum(tables[i].rows * (tables[i].dim * copies + per_row) for i in dp)] * world_size
    if mp:
        placed = plan(
            [tables[i] for i in mp],
            world_size,
            strategy,
            column_slice_threshold=column_slice_threshold,
            **workload,
        )
        for shard in placed.shards:
            per_rank[shard.rank] += shard.rows * (shard.cols * copies + per_row)
    # a row-sliced table gives every rank rows // N rows and the first rows % N one more:
    # add the common part once and the extra rows as steps (one pass, whatever N)
    steps = [0] * (world_size + 1)
    for i in rs:
        base, extra = divmod(tables[i].rows, world_size)
        row = tables[i].dim * copies + per_row
        steps[0] += (base + 1) * row  # ranks below `extra` hold one row more
        steps[extra] -= row
    level = 0
    for rank in range(world_size):
        level += steps[rank]
        per_rank[rank] += level
    return max(per_rank)


def _smallest_piece(table, column_slice_threshold) -> int:
    """Elements of the widest column slice of a model-parallel table at any world size."""
    if column_slice_threshold is None:  # automatic slicing may go down to one column
        return table.rows
    widths = column_slice_widths(table.rows, table.dim, column_slice_threshold, table.dim)
    return table.rows * max(widths)


def _search_range(tables, capacity: int, per_element: int, options: dict, limit: int):
    """``(lowest, highest, reason)``: the world sizes worth planning for ``capacity`` bytes.

    Every rank holds the replicated tables, the rank holding the largest model-parallel
    table holds at least its narrowest column slice, and the ranks together hold all the
    rest, so fewer than ``rest / (capacity - replicated)`` ranks never fit. A row-sliced
    table caps the world size at its row count. ``lowest`` is None when nothing can fit.
    """
    dp, mp, rs = classify(
        tables, options.get("data_parallel_threshold"), options.get("row_slice_threshold")
    )
    room = capacity // per_element  # elements per rank
    replicated = sum(tables[i].elements for i in dp)
    piece, where = max(
        ((_smallest_piece(tables[i], options.get("column_slice_threshold")), i) for i in mp),
        default=(0, None),
    )
    rest = sum(tables[i].elements for i in mp + rs)
    if replicated + piece > room or (rest and replicated >= room):
        parts = []
        if replicated:
            parts.append(
                f"the replicated tables take {human_bytes(replicated * per_element)} "
                f"on every rank"
            )
        if piece:
            parts.append(
                f"table '{tables[where].name}' cannot be cut below "
                f"{human_bytes(piece * per_element)}"
            )
        return None, None, " and ".join(parts)
    lowest = max(1, math.ceil(rest / (room - replicated))) if rest else 1
    highest = min([limit] + [tables[i].rows for i in rs])
    if lowest > highest:
        cap = f"; row-sliced tables allow at most {highest:,}" if highest < limit else ""
        return None, None, f"the tables need at least {lowest:,} ranks{cap}"
    return lowest, highest, ""


def smallest_world_size(
    tables,
    capacity: int,
    optimizer: str,
    limit: int = MAX_WORLD_SIZE,
    dtype_bytes: int = 4,
    max_plans: int = MAX_PLANS,
    table_bytes: int | None = None,
    **options,
) -> Fit:
    """Smallest world size whose busiest rank's bytes (with optimizer slots) fit ``capacity``.

    The search starts at the fewest ranks that could hold the tables at all and plans at
    most ``max_plans`` world sizes (each in one pass), so it answers in about a second for
    any capacity.

    Args:
        tables: Table specs.
        capacity: Bytes per rank (> 0).
        optimizer: A name of ``OPTIMIZER_SLOTS`` (its slots count as copies of a shard,
            ``rowwise_adagrad``'s state as one value per row).
        limit: Largest world size considered.
        dtype_bytes: Bytes per parameter and per value of optimizer state.
        max_plans: World sizes planned at most.
        table_bytes: Bytes per stored parameter where tables are narrower (16-bit: 2);
            ``dtype_bytes`` must be a multiple of it. None: ``dtype_bytes``.
        **options: Placement options of :func:`merlin_models_de.planner.plan`, with the
            step ``work_balanced`` places for (``batch_size``, ``hotness``, ``link``; its
            ``optimizer`` is ``optimizer``): the plan command passes its own, so the world
            size it finds is planned as the plan it prints.

    Returns:
        A :class:`Fit`.
    """
    # counted in units of a stored parameter: its state takes dtype_bytes / unit of them
    unit = table_bytes or dtype_bytes
    state = dtype_bytes // unit
    copies, per_row = 1 + state * OPTIMIZER_SLOTS[optimizer], state * row_slots(optimizer)
    dtype_bytes = unit
    # the range leaves out row-wise state: its lowest world size may only be too low
    lowest, highest, reason = _search_range(tables, capacity, dtype_bytes * copies, options, limit)
    if lowest is None:
        return Fit(None, reason=reason, checked_up_to=limit)
    last = min(highest, lowest + max_plans - 1)
    for n in range(lowest, last + 1):
        values = busiest_elements(
            tables, n, copies=copies, per_row=per_row, optimizer=optimizer, **options
        )
        busiest = values * dtype_bytes
        if busiest <= capacity:
            return Fit(n, busiest, plans=n - lowest + 1)
    why = f"fewer than {lowest:,} ranks cannot hold the tables, and " if lowest > 1 else ""
    if last < highest:
        why += (
            f"the busiest rank is too full at each of the next {max_plans} world sizes "
            f"(larger ones were not planned)"
        )
    else:
        why += "the busiest rank is too full at every world size from there" + (
            f" (row-sliced tables allow at most {highest:,} ranks)" if highest < limit else ""
        )
    return Fit(None, reason=why, plans=last - lowest + 1, checked_up_to=last)
