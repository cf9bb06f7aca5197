"""Calibrates the cost model's link: alpha (ms per collective) and beta (GB/s) of this
machine's Horovod collectives.

``horovodrun --gloo -np 2 -H localhost:2 --network-interface lo python -m
merlin_models_de.apps.tools.link_probe [--sizes 1024,...] [--iterations 30] [--report probe.json]``

For each size (bytes of float32 per rank) it times, in a ``tf.function``, one all-to-all
(every destination gets ``size / N``) and one allreduce, ``--iterations`` calls after a few
warm-up calls, all ranks starting together; a call's time is the slowest rank's and the median
over calls is kept. Then it fits ``t = alpha + wire / beta`` by least squares, with the wire
bytes of :mod:`merlin_models_de.planner.cost` (all-to-all: ``(N-1)/N`` of the buffer; ring
allreduce: ``2(N-1)/N``). Rank 0 prints the table and the fit; ``--report`` writes JSON.
Horovod's coordination cycle (``HOROVOD_CYCLE_TIME``) is part of alpha: the report says which
value the run used.

Example:
    horovodrun --gloo -np 2 -H localhost:2 --network-interface lo \\
        python -m merlin_models_de.apps.tools.link_probe --report probe.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from merlin_models_de.apps.common.options import ints, write_json
from merlin_models_de.apps.common.program import program_name

DEFAULT_SIZES = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


def fit(points) -> tuple[float, float]:
    """Least squares of ``ms = alpha + wire_bytes / (beta * 1e6)`` over ``(wire, ms)``:
    ``(alpha_ms, beta_gbps)``.

    Example:
        >>> fit([(0, 1.0), (1_000_000, 2.0)])
        (1.0, 1.0)
    """
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(points) < 2 or len(set(xs)) < 2:
        raise ValueError(f"The fit needs two different sizes. Received: {sorted(set(xs))}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum(
        (x - mx) ** 2 for x in xs
    )  # ms per byte
    alpha = my - slope * mx
    beta = 1.0 / (slope * 1e6) if slope > 0 else float("inf")
    return round(alpha, 4), round(beta, 4)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=program_name("merlin_models_de.apps.tools.link_probe"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--sizes", type=ints, default=list(DEFAULT_SIZES), help="bytes per rank, comma separated"
    )
    ap.add_argument("--iterations", type=int, default=30, help="timed calls per size")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--report", default=None, help="JSON report path (rank 0)")
    return ap


def _time(fn, x, iterations, warmup, tag) -> float:
    """Median ms of one call, each call counted at the slowest rank."""
    from merlin_models_de import comm

    for _ in range(warmup):
        fn(x)
    comm.barrier(name=f"mmde_probe_{tag}")
    mine = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn(x)
        mine.append((time.perf_counter() - t0) * 1e3)
    every = comm.allgather_object(mine, name=f"mmde_probe_{tag}_times")
    return statistics.median(max(calls) for calls in zip(*every))


def _functions(tf, comm, splits, size):
    """The two timed ``tf.function`` s for one size (fixed collective names)."""

    @tf.function
    def alltoall(t):
        return comm.alltoall(t, splits, name=f"mmde_probe_a2a_{size}")[0]

    @tf.function
    def allreduce(t):
        return comm.allreduce(t, op="sum", name=f"mmde_probe_ar_{size}")

    return alltoall, allreduce


def main(argv=None) -> int:
    """Entry point; returns the process exit code."""
    from merlin_models_de.apps.common.console import quiet_imports

    quiet_imports()
    args = _parser().parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        print(
            f"error: --iterations must be >= 1 and --warmup >= 0. Received: "
            f"--iterations={args.iterations}, --warmup={args.warmup}",
            file=sys.stderr,
        )
        return 2
    import tensorflow as tf

    from merlin_models_de import comm

    n, rank = comm.size(), comm.rank()
    if n < 2:
        print(
            "error: run under horovodrun with at least 2 ranks. Received: world size 1",
            file=sys.stderr,
        )
        return 2
    rows = []
    for size in args.sizes:
        elements = max(n, size // 4 // n * n)  # float32, the same count to every rank
        x = tf.ones([elements], tf.float32)
        splits = tf.fill([n], elements // n)

        alltoall, allreduce = _functions(tf, comm, splits, size)
        buffer = elements * 4
        rows.append(
            {
                "bytes": buffer,
                "alltoall_ms": _time(alltoall, x, args.iterations, args.warmup, f"a2a_{size}"),
                "alltoall_wire": (n - 1) * buffer // n,
                "allreduce_ms": _time(allreduce, x, args.iterations, args.warmup, f"ar_{size}"),
                "allreduce_wire": 2 * (n - 1) * buffer // n,
            }
        )
    a2a = fit([(r["alltoall_wire"], r["alltoall_ms"]) for r in rows])
    ar = fit([(r["allreduce_wire"], r["allreduce_ms"]) for r in rows])
    report = {
        "world_size": n,
        "rows": rows,
        "alltoall": {"alpha_ms": a2a[0], "beta_gbps": a2a[1]},
        "allreduce": {"alpha_ms": ar[0], "beta_gbps": ar[1]},
        "horovod_cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME", "default"),
        "iterations": args.iterations,
    }
    if rank == 0:
        print(f"{'bytes':>10} {'alltoall ms':>12} {'allreduce ms':>13}")
        for r in rows:
            print(f"{r['bytes']:>10,} {r['alltoall_ms']:>12.3f} {r['allreduce_ms']:>13.3f}")
        print(f"alltoall:  alpha {a2a[0]:.3f} ms, beta {a2a[1]:.3f} GB/s")
        print(f"allreduce: alpha {ar[0]:.3f} ms, beta {ar[1]:.3f} GB/s")
        write_json(args.report, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
