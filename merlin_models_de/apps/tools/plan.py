"""Command line: print the placement plan of a schema for a world size.

Usage:
    mmde-plan criteo --world-size 4 --column-slice-threshold 16777216 \
        --device-memory 80GB

Defaults are the DLRM command's (``work_balanced``, dim 16, Adagrad, 512 samples a rank),
so a plan printed here is what that command places; the first line says what was assumed.
Given a DLRM run's placement options, ``--dim``, ``--batch-size``, ``--optimizer``,
``--table-scale`` and ``--dynamic``, it prints what that run's block places:
``work_balanced`` places for the command's own batch size and optimizer as it does here,
and the command has no ``--hotness`` or ``--link`` (leave those at their defaults). The
block's own defaults differ (``basic``, the optimizer of ``compile``): pass ``--strategy``
and ``--optimizer`` to plan a block of your own. After the per-rank totals, one line per
rank lists its tables and slices with their rows and widths.

The schema argument is a Merlin schema file (``schema.pbtxt`` / ``schema.json``), a dataset
directory holding one, or the name of a Merlin synthetic dataset (``criteo``, ``aliccp-raw``,
``music-streaming``, ...); Merlin's schema reader loads TensorFlow, nothing here loads
Horovod. Bad options exit with status 2 and one line.

``--dynamic FEATURE[=CAPACITY]`` (repeatable, as the DLRM command takes it) plans that
feature's table as a dynamic table (docs/dynamic.md): its rows are the capacity (default:
the column's cardinality), sliced by rows over the ranks, and each rank's share has a key
map beside it, which one more line shows per rank (56 bytes a row,
:data:`~merlin_models_de.planner.types.KEY_MAP_BYTES_PER_ROW`; counted in "with slots" and
in the predicted peaks).
"""

from __future__ import annotations

import argparse
import math
import sys

from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.dynamic import (
    add_dynamic_options,
    dynamic_problem,
    dynamic_tables,
)
from merlin_models_de.apps.common.hotness import parse_hotness, resolve_hotness
from merlin_models_de.apps.common.options import parse_bytes
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.apps.common.schemas import load_schema
from merlin_models_de.apps.tools.fit import (  # noqa: F401 (the command's API)
    MAX_PLANS,
    MAX_WORLD_SIZE,
    Fit,
    busiest_elements,
    smallest_world_size,
)
from merlin_models_de.planner import (
    OPTIMIZER_SLOTS,
    STRATEGIES,
    ShardingType,
    plan,
    validate_options,
)
from merlin_models_de.planner.cost import LINKS
from merlin_models_de.planner.hotness import DEFAULT_MULTI_HOT
from merlin_models_de.planner.memory import plan_peak_bytes
from merlin_models_de.planner.types import KEY_MAP_BYTES_PER_ROW
from merlin_models_de.planner.work import DEFAULT_BATCH_SIZE, rank_times
from merlin_models_de.tables import (
    TABLE_DTYPES,
    human_bytes,
    narrow_table_bytes,
    tables_from_schema,
)


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
        prog=program_name("merlin_models_de.apps.tools.plan"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    ap.add_argument("--strategy", default="work_balanced", choices=STRATEGIES)
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
        "--table-dtype",
        default=None,
        choices=TABLE_DTYPES,
        help="the block's table_dtype: 16-bit tables take 2 bytes a parameter, their "
        "optimizer state --dtype-bytes",
    )
    ap.add_argument(
        "--table-scale",
        type=float,
        default=1.0,
        help="every table's rows times this (as the DLRM command's option)",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"samples per rank per step the step time is predicted for (default "
        f"{DEFAULT_BATCH_SIZE}, as the DLRM command; work_balanced places for it)",
    )
    ap.add_argument(
        "--link",
        default="gloo-loopback",
        choices=sorted(LINKS),
        help="the interconnect (and device) the step time is predicted on",
    )
    ap.add_argument(
        "--hotness",
        default=None,
        help="mean ids per sample of multi-hot features: one number, or feature=h,... "
        f"(default: the schema's value_count, else {DEFAULT_MULTI_HOT:g})",
    )
    ap.add_argument(
        "--device-memory",
        default=None,
        help="e.g. 80GB: also report the smallest world size whose busiest rank fits",
    )
    add_dynamic_options(ap.add_argument_group("dynamic tables (docs/dynamic.md)"))
    return ap


def peak_line(placement, optimizer: str, dtype_bytes: int, table_bytes=None) -> str:
    """The memory model's predicted peak resident bytes of each rank (planner.memory)."""
    peaks = plan_peak_bytes(placement, optimizer, dtype_bytes, table_bytes=table_bytes)
    return "predicted peak resident memory per rank (runtime + tables with slots): " + ", ".join(
        f"r{r} {human_bytes(b)}" for r, b in enumerate(peaks)
    )


def key_map_shares(placement, rank: int) -> list:
    """``[(table, rows)]`` of ``rank``'s shares of dynamic tables: each has a key map."""
    dynamic = {t.name for t in placement.tables if t.dynamic is not None}
    return [(s.table, s.rows) for s in placement.shards_on(rank) if s.table in dynamic]


def key_map_lines(placement) -> list[str]:
    """Per rank, its dynamic tables' key maps and their bytes ([] without dynamic tables)."""
    if not any(t.dynamic is not None for t in placement.tables):
        return []
    lines = [
        f"key maps of dynamic tables per rank ({KEY_MAP_BYTES_PER_ROW} B a row of its share: "
        "keys, counts, last steps and the hash index; counted in 'with slots'):"
    ]
    for rank in range(placement.world_size):
        shares = ", ".join(f"{t} {rows:,} rows" for t, rows in key_map_shares(placement, rank))
        lines.append(
            f"rank {rank}: {human_bytes(placement.key_map_bytes(rank))}"
            + (f" ({shares})" if shares else "")
        )
    return lines


def step_lines(placement, args, hotness) -> list[str]:
    """Per rank: the lookups it serves, its predicted step (planner.work: their compute and
    updates, its part of the collectives; the dense layers left out) and its bytes with the
    optimizer's state."""
    times = rank_times(
        placement,
        args.batch_size,
        link=args.link,
        optimizer=args.optimizer,
        hotness=hotness,
    )
    lines = [
        f"predicted step per rank on {args.link}, {args.batch_size:,} samples a rank "
        f"(embedding lookups, updates and exchanges; the dense layers left out):",
        f"{'rank':>4} {'lookups':>7} {'compute ms':>10} {'exchange ms':>11} "
        f"{'step ms':>8} {'memory':>10}",
    ]
    for t in times:
        memory = placement.rank_bytes(
            t.rank, args.optimizer, args.dtype_bytes, table_bytes=table_bytes(args)
        )
        lines.append(
            f"{t.rank:>4} {t.lookups:>7} {t.compute_ms:>10.2f} {t.comm_ms:>11.2f} "
            f"{t.total_ms:>8.2f} {human_bytes(memory):>10}"
        )
    busiest = max(times, key=lambda t: (t.total_ms, -t.rank))
    lines.append(
        f"busiest rank {busiest.rank}: {busiest.total_ms:.2f} ms a step "
        f"(memory with {args.optimizer} state)"
    )
    return lines


def table_bytes(args) -> int | None:
    """Bytes of a stored parameter under ``--table-dtype`` (None: ``--dtype-bytes``)."""
    return narrow_table_bytes(args.table_dtype)


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


def _tables(args):
    """The schema's tables (``--table-scale``, ``--dim``), the multi-hot features' hotness and
    a line saying where it came from (None without multi-hot features)."""
    schema = load_schema(args.schema)
    if args.table_scale != 1.0:
        from merlin_models_de.apps.common.synthetic import capped_schema

        schema = capped_schema(schema, None, args.table_scale)
    dynamic = dynamic_tables(args, schema)  # capacities of the scaled schema, as the DLRM's
    tables = tables_from_schema(schema, dim=args.dim or None, dynamic=dynamic or None)
    features = [f for t in tables for f in t.features]
    hotness, line = resolve_hotness(args.hotness, schema, features, default=DEFAULT_MULTI_HOT)
    return tables, hotness, line


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
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1. Received: --batch-size={args.batch_size}")
        parse_hotness(args.hotness)  # a bad value fails before the schema loads
        problem = dynamic_problem(args)
        if problem:
            raise ValueError(problem)
        if not (math.isfinite(args.table_scale) and args.table_scale > 0):
            raise ValueError(
                "--table-scale must be a finite number > 0. "
                f"Received: --table-scale={args.table_scale}"
            )
        tables, hotness, hotness_line = _tables(args)
        # the step work_balanced places for: the printed plan's and the search's
        workload = dict(batch_size=args.batch_size, hotness=hotness, link=args.link)
        p = plan(tables, args.world_size, **options, **workload, optimizer=args.optimizer)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(assumptions_line(args))
    narrow = table_bytes(args)
    print(p.summary(optimizer=args.optimizer, dtype_bytes=args.dtype_bytes, table_bytes=narrow))
    for line in key_map_lines(p):
        print(line)
    print(peak_line(p, args.optimizer, args.dtype_bytes, narrow))
    if hotness_line:
        print(hotness_line)
    print("\n".join(step_lines(p, args, hotness)))
    print(rank_listing(p))
    if capacity is not None:
        fit = smallest_world_size(
            tables,
            capacity,
            args.optimizer,
            dtype_bytes=args.dtype_bytes,
            table_bytes=narrow,
            **options,
            **workload,
        )
        print(_fit_line(fit, args, capacity))
    return 0


if __name__ == "__main__":
    sys.exit(main())
