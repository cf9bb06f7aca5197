"""Command line: the collectives of one DLRM training step and their predicted time per link.

Usage:
    python -m merlin_models_de.apps.bench.cost --dataset criteo --np 2,8 --batch-size 512 \\
        --dim 16 --strategy memory_optimized --column-slice-threshold 16777216

For each world size it plans the tables of the schema (as the plan command does), lists every
collective of one step of the horovod backend (:mod:`merlin_models_de.planner.cost`): stage,
kind, direction, the busiest rank's bytes in and out, the bytes it moves over its link, and
the milliseconds each link of ``--links`` predicts, then the totals. The dense gradients are
those of Merlin's ``DLRMModel`` with ``--bottom-mlp`` / ``--top-mlp`` (as the DLRM command
builds it) unless ``--dense-params`` is given. ``--dataset`` is a schema file, a dataset
directory or a Merlin synthetic dataset name (loading a schema loads TensorFlow). Bad options
exit with status 2 and one line.
"""

from __future__ import annotations

import argparse
import sys

from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.hotness import parse_hotness, resolve_hotness
from merlin_models_de.apps.common.options import ints, write_json
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.backends.options import EXCHANGE_DTYPES
from merlin_models_de.planner import OPTIMIZER_SLOTS, STRATEGIES, plan, validate_options
from merlin_models_de.planner.cost import (
    LINKS,
    dlrm_dense_params,
    get_link,
    predict,
    step_costs,
    table_lines,
)
from merlin_models_de.planner.work import rank_times
from merlin_models_de.tables import feature_order

DEFAULT_LINKS = ("gloo-loopback", "nvlink-nccl", "infiniband-nccl")
# Horovod fused DLRM's 10 dense gradients into 2 allreduce rounds per step here (timeline)
DEFAULT_ALLREDUCE_ROUNDS = 2


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=program_name("merlin_models_de.apps.bench.cost"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--dataset",
        default="criteo",
        help="schema file, dataset directory or synthetic dataset name",
    )
    ap.add_argument("--np", type=ints, default=[2], help="world sizes, e.g. 2,8")
    batch = ap.add_mutually_exclusive_group()
    batch.add_argument(
        "--batch-size", type=int, default=None, help="samples per rank per step (default 512)"
    )
    batch.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="samples per step over all ranks (divided by each world size)",
    )
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--strategy", default="work_balanced", choices=STRATEGIES)
    ap.add_argument("--column-slice-threshold", type=int, default=None)
    ap.add_argument("--row-slice-threshold", type=int, default=None)
    ap.add_argument("--data-parallel-threshold", type=int, default=None)
    ap.add_argument("--bottom-mlp", type=ints, default=[128])
    ap.add_argument("--top-mlp", type=ints, default=[128, 64])
    ap.add_argument(
        "--dense-params",
        type=int,
        default=None,
        help="allreduced dense parameters (default: DLRM's from the MLP options)",
    )
    ap.add_argument("--allreduce-rounds", type=int, default=DEFAULT_ALLREDUCE_ROUNDS)
    ap.add_argument(
        "--hotness",
        default=None,
        help="mean ids per sample of multi-hot features: one number, or "
        "feature=h,... (default: the schema's value_count max, else min)",
    )
    ap.add_argument(
        "--optimizer",
        default="adagrad",
        choices=sorted(OPTIMIZER_SLOTS),
        help="whose update the per-rank step prices (and work_balanced places for)",
    )
    ap.add_argument("--dtype-bytes", type=int, default=4, choices=(2, 4, 8))
    ap.add_argument(
        "--exchange-dtype",
        default=None,
        choices=EXCHANGE_DTYPES,
        help="the block's exchange_dtype: rows cross ranks in 2 bytes",
    )
    ap.add_argument(
        "--links",
        default=",".join(DEFAULT_LINKS),
        help=f"comma separated, of {', '.join(sorted(LINKS))}",
    )
    ap.add_argument("--json", default=None, help="also write the collectives here")
    return ap


def rank_line(p, batch, link, args, features, hotness, dense) -> str:
    """Each rank's predicted step on ``link`` (``planner.work``: its lookups' compute and
    updates with ``--optimizer``, its part of the collectives) and the lookups it serves."""
    times = rank_times(
        p,
        batch,
        link=link,
        optimizer=args.optimizer,
        features=features,
        hotness=hotness,
        dense_params=dense,
        allreduce_rounds=args.allreduce_rounds,
        exchange_bytes=2 if args.exchange_dtype else None,
    )
    return f"per rank on {link} ({args.optimizer}): " + ", ".join(
        f"r{t.rank} {t.total_ms:.2f} ms ({t.lookups} lookups, compute {t.compute_ms:.2f})"
        for t in times
    )


def _continuous(schema) -> int:
    from merlin.schema import Tags

    return sum(1 for col in schema if Tags.CONTINUOUS in col.tags and Tags.TARGET not in col.tags)


def _check(args) -> None:
    for name in ("dim", "allreduce_rounds"):
        if getattr(args, name) < 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= 1. Received: {getattr(args, name)}"
            )
    for name in ("batch_size", "global_batch_size", "dense_params"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "dense_params" else 1):
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} must be >= {0 if name == 'dense_params' else 1}. "
                f"Received: {flag}={value}"
            )
    for n in args.np:
        validate_options(
            n,
            args.strategy,
            args.column_slice_threshold,
            args.row_slice_threshold,
            args.data_parallel_threshold,
        )
        if args.global_batch_size is not None and args.global_batch_size % n:
            raise ValueError(
                f"--global-batch-size must divide by every world size. "
                f"Received: --global-batch-size={args.global_batch_size}, --np {n}"
            )


def main(argv=None) -> int:
    """Entry point; returns the process exit code."""
    quiet_imports()
    args = _parser().parse_args(argv)
    try:
        _check(args)
        links = [get_link(name.strip()) for name in args.links.split(",") if name.strip()]
        parse_hotness(args.hotness)  # a bad value fails before the schema loads
        from merlin_models_de.apps.common.schemas import load_schema
        from merlin_models_de.tables import tables_from_schema

        schema = load_schema(args.dataset)
        tables = tables_from_schema(schema, dim=args.dim)
        features = feature_order(tables)
        hotness, hotness_line = resolve_hotness(args.hotness, schema, features)
        dense = args.dense_params
        if dense is None:
            dense = dlrm_dense_params(
                _continuous(schema), len(features), args.dim, args.bottom_mlp, args.top_mlp
            )
        report = []
        for n in args.np:
            batch = (
                args.global_batch_size // n if args.global_batch_size else args.batch_size or 512
            )
            p = plan(
                tables,
                n,
                args.strategy,
                column_slice_threshold=args.column_slice_threshold,
                row_slice_threshold=args.row_slice_threshold,
                data_parallel_threshold=args.data_parallel_threshold,
                batch_size=batch,
                hotness=hotness,
                optimizer=args.optimizer,
                link=links[0].name if links else DEFAULT_LINKS[0],
            )
            costs = step_costs(
                p,
                batch,
                features=features,
                hotness=hotness,
                dtype_bytes=args.dtype_bytes,
                dense_params=dense,
                allreduce_rounds=args.allreduce_rounds,
                exchange_bytes=2 if args.exchange_dtype else None,
            )
            print(
                f"{args.dataset}: {len(features)} features in {len(tables)} tables, dim "
                f"{args.dim}, {args.strategy}; {n} ranks x {batch:,} = {n * batch:,} samples "
                f"per step; {dense:,} dense parameters; bytes per step"
            )
            if hotness_line:
                print(hotness_line)
            print("\n".join(table_lines(costs, links)))
            for link in links:
                print(rank_line(p, batch, link.name, args, features, hotness, dense))
            report.append(
                {
                    "world_size": n,
                    "batch_size": batch,
                    "dense_params": dense,
                    "collectives": [c.__dict__ for c in costs.collectives],
                    "predicted_ms": {link.name: predict(costs, link) for link in links},
                }
            )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
