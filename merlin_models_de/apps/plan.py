"""Command line: print the placement plan of a schema for a world size.

Usage:
    merlin-models-de-plan criteo --world-size 4 --strategy memory_optimized \
        --column-slice-threshold 16777216 --dim 16 --optimizer adagrad --device-memory 80GB

The schema argument is a Merlin schema file (``schema.pbtxt`` / ``schema.json``), a dataset
directory holding one, or the name of a Merlin synthetic dataset (``criteo``, ``aliccp-raw``,
``music-streaming``, ...). Nothing here imports TensorFlow or Horovod.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from merlin_models_de.planner import OPTIMIZER_SLOTS, STRATEGIES, plan, validate_options
from merlin_models_de.schemas import load_schema
from merlin_models_de.tables import human_bytes, tables_from_schema

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``'80GB' -> 80_000_000_000``; ``'16GiB' -> 17179869184``.

    Example:
        >>> parse_bytes("1.5KiB")
        1536
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"device memory must look like '80GB' or '16GiB'. "
                         f"Received: --device-memory={text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def smallest_world_size(tables, capacity: int, optimizer: str, limit: int = 4096,
                        dtype_bytes: int = 4, **options):
    """Smallest world size whose busiest rank's bytes (with optimizer slots) fit ``capacity``.

    Returns ``(world_size, plan)`` or ``(None, None)`` when none up to ``limit`` fits.
    """
    slots = OPTIMIZER_SLOTS[optimizer]
    for n in range(1, limit + 1):
        p = plan(tables, n, **options)
        busiest = max(p.rank_elements(r) for r in range(n)) * dtype_bytes * (1 + slots)
        if busiest <= capacity:
            return n, p
    return None, None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="merlin-models-de-plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("schema", help="schema file, dataset directory or synthetic dataset name")
    ap.add_argument("--world-size", "-n", type=int, default=2)
    ap.add_argument("--strategy", default="basic", choices=STRATEGIES)
    ap.add_argument("--column-slice-threshold", type=int, default=None)
    ap.add_argument("--row-slice-threshold", type=int, default=None)
    ap.add_argument("--data-parallel-threshold", type=int, default=None)
    ap.add_argument("--dim", type=int, default=None, help="embedding width (default: inferred)")
    ap.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZER_SLOTS))
    ap.add_argument("--dtype-bytes", type=int, default=4, choices=(2, 4, 8),
                    help="bytes per parameter (4: float32)")
    ap.add_argument("--device-memory", default=None,
                    help="e.g. 80GB: also report the smallest world size whose busiest rank fits")
    return ap


def main(argv=None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    options = dict(strategy=args.strategy, column_slice_threshold=args.column_slice_threshold,
                   row_slice_threshold=args.row_slice_threshold,
                   data_parallel_threshold=args.data_parallel_threshold)
    try:
        validate_options(args.world_size, **options)
        capacity = parse_bytes(args.device_memory) if args.device_memory else None
        tables = tables_from_schema(load_schema(args.schema), dim=args.dim)
        p = plan(tables, args.world_size, **options)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(p.summary(optimizer=args.optimizer, dtype_bytes=args.dtype_bytes))
    if capacity is not None:
        n, fit = smallest_world_size(tables, capacity, args.optimizer,
                                     dtype_bytes=args.dtype_bytes, **options)
        if n is None:
            print(f"No world size up to 4096 fits {human_bytes(capacity)} per rank.")
        else:
            busiest = max(fit.rank_elements(r) for r in range(n)) * args.dtype_bytes
            print(f"Smallest world size whose busiest rank fits {args.device_memory}: {n} "
                  f"(busiest rank {human_bytes(busiest * (1 + OPTIMIZER_SLOTS[args.optimizer]))} "
                  f"with {args.optimizer} slots)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
