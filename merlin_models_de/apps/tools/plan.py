"""Command line: print the placement plan of a schema for a world size.

Usage:
    mmde-plan criteo --world-size 4 --column-slice-threshold 16777216 \
        --device-memory 80GB

Defaults are the DLRM command's (``memory_optimized``, dim 16, Adagrad), so a plan printed
here is what that command places; the first line says what was assumed. The block's own
defaults differ (``basic``, the optimizer of ``compile``): pass ``--strategy`` and
``--optimizer`` to plan a block of your own. After the per-rank totals, one line per rank lists its
tables and slices with their rows and widths.

The schema argument is a Merlin schema file (``schema.pbtxt`` / ``schema.json``), a dataset
directory holding one, or the name of a Merlin synthetic dataset (``criteo``, ``aliccp-raw``,
``music-streaming``, ...); Merlin's schema reader loads TensorFlow, nothing here loads
Horovod. Bad options exit with status 2 and one line.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.options import parse_bytes
from merlin_models_de.planner import (
    OPTIMIZER_SLOTS,
    STRATEGIES,
    ShardingType,
    plan,
    row_slots,
    validate_options,
)
from merlin_models_de.planner.memory import plan_peak_bytes
from merlin_models_de.planner.slicing import classify, column_slice_widths
from merlin_models_de.schemas import load_schema
from merlin_models_de.tables import human_bytes, tables_from_schema

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
) -> int:
    """Elements on the busiest rank of ``plan(tables, world_size, ...)``, in one pass, each
    counted ``copies`` times, plus ``per_row`` values for each row the rank holds (row-wise
    optimizer state).

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
        dtype_bytes: Bytes per parameter.
        max_plans: World sizes planned at most.
        **options: Placement options of :func:`merlin_models_de.planner.plan`.

    Returns:
        A :class:`Fit`.
    """
    copies, per_row = 1 + OPTIMIZER_SLOTS[optimizer], row_slots(optimizer)
    # the range leaves out row-wise state: its lowest world size may only be too low
    lowest, highest, reason = _search_range(tables, capacity, dtype_bytes * copies, options, limit)
    if lowest is None:
        return Fit(None, reason=reason, checked_up_to=limit)
    last = min(highest, lowest + max_plans - 1)
    for n in range(lowest, last + 1):
        values = busiest_elements(tables, n, copies=copies, per_row=per_row, **options)
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


def shard_text(shard, table) -> str:
    """One shard as ``name rows x width`` and what part of its table it is.

    Example:
        >>> from merlin_models_de.planner import Shard
        >>> from merlin_models_de.tables import TableSpec
        >>> t = TableSpec("C1", rows=1000, dim=16, features=())
        >>> shard_text(Shard("C1", 1, ShardingType.COLUMN_WISE, 0, 1000, 8, 8), t)
        'C1 1,000x8 (columns 8-15 of 16)'
    """
    text = f"{shard.table} {shard.rows:,}x{shard.cols}"
    if shard.kind is ShardingType.COLUMN_WISE:
        return (
            text + f" (columns {shard.col_start}-{shard.col_start + shard.cols - 1} of {table.dim})"
        )
    if shard.kind is ShardingType.ROW_WISE:
        return text + (
            f" (rows {shard.row_start:,}-{shard.row_start + shard.rows - 1:,} of "
            f"{table.rows:,})"
        )
    if shard.kind is ShardingType.DATA_PARALLEL:
        return text + " (replicated)"
    return text


def rank_listing(placement) -> str:
    """Each rank's tables and slices with their rows and widths, one line per rank."""
    tables = {t.name: t for t in placement.tables}
    return "\n".join(
        f"rank {rank}: "
        + (
            ", ".join(shard_text(s, tables[s.table]) for s in placement.shards_on(rank))
            or "nothing"
        )
        for rank in range(placement.world_size)
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mmde-plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("schema", help="schema file, dataset directory or synthetic dataset name")
    ap.add_argument(
        "--world-size",
        "-n",
        type=int,
        default=2,
        help=f"ranks to plan for (at most {MAX_WORLD_SIZE})",
    )
    # the DLRM command's defaults, so that its plan is what a bare run of it places
    ap.add_argument("--strategy", default="memory_optimized", choices=STRATEGIES)
    ap.add_argument("--column-slice-threshold", type=int, default=None)
    ap.add_argument("--row-slice-threshold", type=int, default=None)
    ap.add_argument("--data-parallel-threshold", type=int, default=None)
    ap.add_argument(
        "--dim",
        type=int,
        default=16,
        help="embedding width (default 16, as the DLRM command; 0: inferred "
        "from the cardinalities as mm.Embeddings does)",
    )
    ap.add_argument("--optimizer", default="adagrad", choices=sorted(OPTIMIZER_SLOTS))
    ap.add_argument(
        "--dtype-bytes",
        type=int,
        default=4,
        choices=(2, 4, 8),
        help="bytes per parameter (4: float32)",
    )
    ap.add_argument(
        "--table-scale",
        type=float,
        default=1.0,
        help="every table's rows times this (as the DLRM command's option)",
    )
    ap.add_argument(
        "--device-memory",
        default=None,
        help="e.g. 80GB: also report the smallest world size whose busiest rank fits",
    )
    return ap


def peak_line(placement, optimizer: str, dtype_bytes: int) -> str:
    """The memory model's predicted peak resident bytes of each rank (planner.memory)."""
    peaks = plan_peak_bytes(placement, optimizer, dtype_bytes)
    return "predicted peak resident memory per rank (runtime + tables with slots): " + ", ".join(
        f"r{r} {human_bytes(b)}" for r, b in enumerate(peaks)
    )


def assumptions_line(args) -> str:
    """What the plan assumed: the DLRM command's defaults unless given, not the block's."""
    return (
        f"Planned for strategy={args.strategy}, optimizer={args.optimizer}, dim={args.dim or 'inferred'} "
        f"(defaults: the DLRM command's; mm.DistributedEmbeddings places with strategy='basic' "
        f"unless given one and trains with the optimizer you compile: pass --strategy and "
        f"--optimizer to plan your own block, or print block.summary() after compile)"
    )


def _fit_line(fit: Fit, args, capacity: int) -> str:
    if fit.world_size is None:
        return (
            f"No world size up to {fit.checked_up_to:,} fits {human_bytes(capacity)} per "
            f"rank: {fit.reason}."
        )
    return (
        f"Smallest world size whose busiest rank fits {args.device_memory}: "
        f"{fit.world_size} (busiest rank {human_bytes(fit.busiest_bytes)} with "
        f"{args.optimizer} slots)"
    )


def main(argv=None) -> int:
    """Entry point; returns the process exit code."""
    quiet_imports()
    args = _parser().parse_args(argv)
    options = dict(
        strategy=args.strategy,
        column_slice_threshold=args.column_slice_threshold,
        row_slice_threshold=args.row_slice_threshold,
        data_parallel_threshold=args.data_parallel_threshold,
    )
    try:
        validate_options(args.world_size, **options)
        if args.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"world_size must be <= {MAX_WORLD_SIZE}. "
                f"Received: world_size={args.world_size}"
            )
        capacity = (
            parse_bytes(args.device_memory, "--device-memory") if args.device_memory else None
        )
        if not (math.isfinite(args.table_scale) and args.table_scale > 0):
            raise ValueError(
                "--table-scale must be a finite number > 0. "
                f"Received: --table-scale={args.table_scale}"
            )
        schema = load_schema(args.schema)
        if args.table_scale != 1.0:
            from merlin_models_de.apps.common.synthetic import capped_schema

            schema = capped_schema(schema, None, args.table_scale)
        tables = tables_from_schema(schema, dim=args.dim or None)
        p = plan(tables, args.world_size, **options)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(assumptions_line(args))
    print(p.summary(optimizer=args.optimizer, dtype_bytes=args.dtype_bytes))
    print(peak_line(p, args.optimizer, args.dtype_bytes))
    print(rank_listing(p))
    if capacity is not None:
        fit = smallest_world_size(
            tables, capacity, args.optimizer, dtype_bytes=args.dtype_bytes, **options
        )
        print(_fit_line(fit, args, capacity))
    return 0


if __name__ == "__main__":
    sys.exit(main())
