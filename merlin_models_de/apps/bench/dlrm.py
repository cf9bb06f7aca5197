"""Benchmark harness: DLRM samples/s and per-rank memory against Merlin's own baselines.

Runs, on the same synthetic data and the same steps (the DLRM command, one process per run):

- ``single``: one process, ``mm.Embeddings``, global batch N*B (the compute limit on a host
  whose cores the N ranks share);
- ``data-parallel``: N ranks, ``mm.Embeddings``, batch B each, as Merlin does it today;
- ``bound/local-tables``: N ranks, batch B each, every rank training its own copy of every
  table and only the dense gradients averaged: not a valid training, but the least work an
  exact sharded step does (its compute and the one dense average, no rows exchanged): the
  highest speed a sharded run can reach on this host;
- ``horovod/<strategy>``: N ranks, ``DistributedEmbeddings`` with the built-in backend (plus one
  run without id validation, to price the check);
- ``distributed-embeddings/<strategy>``: the same with NVIDIA's engine, where it imports.

Every run is repeated ``--repeats`` times (the repeats interleaved: run 1 of every
configuration, then run 2, ...), so the machine's drift touches all configurations alike.
Speed is global samples/s over the warm epochs (the first epoch, with tracing and table
initialization, is reported apart): the median over repeats with its min-max spread, ratios to
``single`` and ``data-parallel`` taken between medians, and against ``single`` also paired (the
median of each round's ratio, which the host's drift between rounds moves less). A repeat
during whose warm epochs the hypervisor took more than ``--max-steal`` of the host's CPU time
(``steal`` in /proc/stat: the VM's cores were ready and ran someone else) is run again, up to
``--steal-retries`` times: such a run measures the neighbours, not the code. Memory is each
rank's embedding bytes and peak resident memory (the largest over repeats). For the first
``horovod/<strategy>`` run of each optimizer, :mod:`merlin_models_de.apps.bench.step_breakdown`
then times the pieces of one step (compute, id exchange, row exchange forward / backward,
dense allreduce, id validation) against the step's time. Output: markdown tables on stdout and
in ``<out>/bench.md``, everything (every repeat, every piece) in ``<out>/bench.json``, a plot
of samples/s and peak memory per rank in ``<out>/bench.png`` (with the capacity curve when
``python -m merlin_models_de.apps.bench.capacity --out <out>`` ran first). ``--out`` defaults
to ``runs/bench`` (git-ignored); ``--out bench`` rewrites the published results.

Examples:
    python -m merlin_models_de.apps.bench --np 2 --optimizers sgd,adagrad
    python -m merlin_models_de.apps.bench --np 2 --optimizers sgd,adagrad --out bench
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from merlin_models_de.apps.bench import step_breakdown
from merlin_models_de.apps.bench.plots import bench_png
from merlin_models_de.apps.bench.runs import (
    DEFAULT_OUT,
    OUT_HELP,
    baseline_and_ranks_args,
    finished_runs,
    write_results,
)
from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.optimizers import LEARNING_RATES
from merlin_models_de.apps.common.options import INPUTS, LOCAL_TABLES
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.backends.registry import AUTO, BACKEND_NAMES, is_installed
from merlin_models_de.persistence.io import read_json
from merlin_models_de.planner import STRATEGIES
from merlin_models_de.tables import human_bytes


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=program_name("merlin_models_de.apps.bench"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--np", type=int, default=2, help="ranks of the multi-process runs")
    ap.add_argument("--hosts", default=None, help="horovodrun -H (default localhost:NP)")
    ap.add_argument(
        "--network-interface",
        default=None,
        help="interface the ranks talk over (default: lo when --hosts is not given; "
        "with --hosts, Horovod's choice)",
    )
    # 40 global batches of 2 x 512 per epoch, 3 warm epochs: 120 warm steps per run
    ap.add_argument("--rows", type=int, default=40960)
    ap.add_argument("--batch-size", type=int, default=512, help="rows per rank per step")
    ap.add_argument("--epochs", type=int, default=4, help="1 cold + the rest warm")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every configuration")
    ap.add_argument(
        "--steps-per-execution",
        type=int,
        default=1,
        help="the DLRM command's --steps-per-execution, for every run",
    )
    ap.add_argument(
        "--input",
        default="tf.data",
        choices=INPUTS,
        help="the DLRM command's --input, for every run",
    )
    ap.add_argument(
        "--breakdown-iterations",
        type=int,
        default=50,
        help="timed calls per piece of the step breakdown (0: no breakdown)",
    )
    ap.add_argument(
        "--exchange-dtypes",
        default="",
        help="comma list (float16, bfloat16): also run the first horovod "
        "strategy with that --exchange-dtype",
    )
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--max-table-rows", type=int, default=None)
    ap.add_argument("--optimizers", default="sgd,adagrad")
    ap.add_argument("--strategies", default="work_balanced")
    ap.add_argument(
        "--column-slice-threshold",
        type=int,
        default=None,
        help="the DLRM command's --column-slice-threshold for the sharded runs "
        "(default: none, the command's own plan; column slices cost a "
        "gather and an update per slice: docs/benchmarks.md)",
    )
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of runs to leave out, e.g. data-parallel,no-validation",
    )
    ap.add_argument(
        "--no-huge-pages",
        dest="huge_pages",
        action="store_false",
        help="every run with the DLRM command's --no-huge-pages (4 KB pages)",
    )
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument(
        "--max-steal",
        type=float,
        default=0.05,
        help="largest share of the host's CPU time its hypervisor may take during "
        "a repeat's warm epochs before the repeat runs again",
    )
    ap.add_argument(
        "--steal-retries",
        type=int,
        default=2,
        help="times a repeat runs again while --max-steal is exceeded",
    )
    ap.add_argument("--out", default=DEFAULT_OUT, help=OUT_HELP)
    return ap


def _runs(args) -> list[dict]:
    skip = set(filter(None, args.skip.split(",")))
    n = args.np
    runs = []
    for opt in args.optimizers.split(","):
        base = [
            "--rows",
            str(args.rows),
            "--epochs",
            str(args.epochs),
            "--dim",
            str(args.dim),
            "--optimizer",
            opt,
            "--quiet",
            "--steps-per-execution",
            str(args.steps_per_execution),
            "--input",
            args.input,
        ]
        if args.max_table_rows:
            base += ["--max-table-rows", str(args.max_table_rows)]
        if not args.huge_pages:
            base.append("--no-huge-pages")
        single, dist = baseline_and_ranks_args(base, args.batch_size, LEARNING_RATES[opt], n)
        runs.append({"name": "single", "optimizer": opt, "ranks": 1, "args": single})
        runs.append(
            {
                "name": "data-parallel",
                "optimizer": opt,
                "ranks": n,
                "args": dist + ["--embeddings", "merlin"],
            }
        )
        runs.append(
            {
                "name": "bound/local-tables",
                "optimizer": opt,
                "ranks": n,
                "args": dist + ["--embeddings", LOCAL_TABLES],
            }
        )
        backends = [b for b in BACKEND_NAMES if b != AUTO and is_installed(b)]
        for backend in backends:
            for i, strategy in enumerate(args.strategies.split(",")):
                place = dist + ["--backend", backend, "--strategy", strategy]
                if args.column_slice_threshold is not None:
                    place += ["--column-slice-threshold", str(args.column_slice_threshold)]
                runs.append(
                    {"name": f"{backend}/{strategy}", "optimizer": opt, "ranks": n, "args": place}
                )
                if backend == "horovod" and i == 0:
                    runs.append(
                        {
                            "name": f"{backend}/{strategy}/no-validation",
                            "optimizer": opt,
                            "ranks": n,
                            "args": place + ["--no-validate-ids"],
                        }
                    )
                    runs.append(
                        {
                            "name": f"{backend}/{strategy}/no-ahead",
                            "optimizer": opt,
                            "ranks": n,
                            "args": place + ["--no-exchange-ahead"],
                        }
                    )
                    runs.append(
                        {
                            "name": f"{backend}/{strategy}/no-merge",
                            "optimizer": opt,
                            "ranks": n,
                            "args": place + ["--no-merge-backward"],
                        }
                    )
                    runs += [
                        {
                            "name": f"{backend}/{strategy}/{dtype}",
                            "optimizer": opt,
                            "ranks": n,
                            "args": place + ["--exchange-dtype", dtype],
                        }
                        for dtype in filter(None, args.exchange_dtypes.split(","))
                    ]
    return [r for r in runs if r["name"].split("/")[-1] not in skip and r["name"] not in skip]


def unstolen_runs(module: str, runs: list, args, report_name, label, failed: list):
    """:func:`finished_runs`, each run launched again (at most ``args.steal_retries`` times)
    while its report says the hypervisor took more than ``args.max_steal`` of the host's CPU
    during its warm epochs; the last attempt is kept whatever its share (the row shows it)."""
    for run in runs:
        for attempt in range(args.steal_retries + 1):
            got = list(finished_runs(module, [run], args, report_name, label, failed))
            if not got:
                break
            stolen = got[0][1].get("warm_host_steal_share")
            if stolen is None or stolen <= args.max_steal or attempt == args.steal_retries:
                yield got[0]
                break
            print(
                f"   the hypervisor took {stolen:.0%} of the host's CPU (more than "
                f"--max-steal {args.max_steal:.0%}): run again",
                flush=True,
            )


def _repeat(rep: dict, seconds: float) -> dict:
    """What one repeat of a run measured (kept whole in the JSON)."""
    last = rep["epochs"][-1]
    return {
        "warm_samples_per_second": rep["warm_samples_per_second"],
        "first_epoch_samples_per_second": rep["first_epoch_samples_per_second"],
        "time_to_first_step": rep["time_to_first_step"],
        "warm_steps": sum(e["steps"] for e in rep["epochs"][1:]),
        "warm_step_seconds": rep.get("warm_step_seconds"),
        "peak_rss_per_rank": last["peak_rss_bytes"],
        "huge_page_bytes_per_rank": last.get("huge_page_bytes"),
        "final_loss": last["loss"],
        "val_auc": last["val_auc"],
        "seconds": seconds,
        "cpu_per_1000_samples": rep.get("warm_cpu_per_1000_samples"),
        "host_steal_share": rep.get("warm_host_steal_share"),
        "round": rep.get("bench_round"),
    }


def _row(run, reps, single, dp) -> dict:
    """One configuration's row from its repeats ``[(report, seconds)]``: medians, spread,
    ratios between medians."""
    first = reps[0][0]
    repeats = [_repeat(rep, seconds) for rep, seconds in reps]
    median = lambda key: statistics.median(r[key] for r in repeats)  # noqa: E731
    sps = [r["warm_samples_per_second"] for r in repeats]
    emb = first["epochs"][-1]["embedding_bytes"]
    rss = [max(r["peak_rss_per_rank"][i] for r in repeats) for i in range(len(emb))]
    row = {
        "run": run["name"],
        "optimizer": run["optimizer"],
        "ranks": run["ranks"],
        "warm_samples_per_second": median("warm_samples_per_second"),
        "warm_min": min(sps),
        "warm_max": max(sps),
        "warm_spread": (max(sps) - min(sps)) / statistics.median(sps),
        "warm_steps": repeats[0]["warm_steps"],
        "warm_step_median": statistics.median(r["warm_step_seconds"]["median"] for r in repeats)
        if all(r["warm_step_seconds"] for r in repeats)
        else None,
        "slowest_step": max((r["warm_step_seconds"] or {}).get("max", 0) for r in repeats),
        "first_epoch_samples_per_second": median("first_epoch_samples_per_second"),
        "time_to_first_step": median("time_to_first_step"),
        "embedding_bytes_per_rank": emb,
        "peak_rss_per_rank": rss,
        "embedding_fraction": max(emb) / first["total_embedding_bytes"],
        "final_loss": repeats[0]["final_loss"],
        "val_auc": repeats[0]["val_auc"],
        "repeats": repeats,
    }
    cpu = [r["cpu_per_1000_samples"] for r in repeats]
    if all(cpu):  # CPU seconds per 1,000 samples, every rank and thread, and the kernel's part
        row["cpu_per_1000_samples"] = statistics.median(c["user"] + c["system"] for c in cpu)
        row["cpu_system_share"] = statistics.median(
            c["system"] / (c["user"] + c["system"]) for c in cpu
        )
    steal = [r["host_steal_share"] for r in repeats if r["host_steal_share"] is not None]
    row["host_steal_share"] = max(steal) if steal else None
    # a step's samples over the median step: speed without the rare long stalls
    row["steady_samples_per_second"] = (
        first["global_batch"] / row["warm_step_median"] if row["warm_step_median"] else None
    )
    for key, ref in (("single", single), ("data_parallel", dp)):
        if ref is not None:
            row[f"x_{key}"] = row["warm_samples_per_second"] / ref["warm_samples_per_second"]
            paired = _paired_ratios(repeats, ref.get("repeats"))
            if paired:
                row[f"paired_x_{key}"] = statistics.median(paired)
            if row["steady_samples_per_second"] and ref["steady_samples_per_second"]:
                row[f"steady_x_{key}"] = (
                    row["steady_samples_per_second"] / ref["steady_samples_per_second"]
                )
            row[f"rss_x_{key}"] = max(rss) / max(ref["peak_rss_per_rank"])
            row[f"first_step_x_{key}"] = row["time_to_first_step"] / ref["time_to_first_step"]
    return row


def _paired_ratios(repeats: list, ref_repeats: list | None) -> list[float]:
    """Each repeat's warm speed over the reference's repeat of the same round.

    The repeats are interleaved, so a round's runs are minutes apart; the host's speed moves
    by more than that between rounds (one process's CPU seconds per sample moved by 45% within
    one session here, with nothing stolen), and the median of these ratios follows less of it
    than the ratio of the medians."""
    if not ref_repeats:
        return []

    def round_of(k, repeat):  # where no round was recorded, the position is the round
        return k if repeat.get("round") is None else repeat["round"]

    by_round = {round_of(k, ref): ref for k, ref in enumerate(ref_repeats)}
    pairs = [(r, by_round.get(round_of(k, r))) for k, r in enumerate(repeats)]
    return [
        r["warm_samples_per_second"] / ref["warm_samples_per_second"]
        for r, ref in pairs
        if ref is not None
    ]


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table (speeds: median over repeats, min-max beside)."""
    head = (
        "| run | opt | ranks | warm samples/s (median) | min-max (spread) | x single | "
        "x single, paired (median of each round's ratio) | "
        "x data-parallel | steady samples/s (batch / median step) | steady x single | "
        "slowest step (ms) | 1st epoch samples/s | time to 1st step (s) | emb bytes/rank "
        "(max, share) | peak RSS/rank (max) | RSS x data-parallel | CPU s per 1k samples "
        "(kernel share) | host CPU stolen (max) | val AUC |"
    )
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['optimizer']} | {r['ranks']} | "
            f"{fmt(r['warm_samples_per_second'], ',.0f')} | "
            f"{r['warm_min']:,.0f}-{r['warm_max']:,.0f} ({r['warm_spread']:.0%}) | "
            f"{fmt(r.get('x_single'), '.2f')} | {fmt(r.get('paired_x_single'), '.2f')} | "
            f"{fmt(r.get('x_data_parallel'), '.2f')} | "
            f"{fmt(r.get('steady_samples_per_second'), ',.0f')} | "
            f"{fmt(r.get('steady_x_single'), '.2f')} | {r.get('slowest_step', 0) * 1e3:,.0f} | "
            f"{fmt(r['first_epoch_samples_per_second'], ',.0f')} | "
            f"{fmt(r['time_to_first_step'], '.1f')} | "
            f"{human_bytes(max(r['embedding_bytes_per_rank']))} "
            f"({r['embedding_fraction']:.2f}) | {human_bytes(max(r['peak_rss_per_rank']))} | "
            f"{fmt(r.get('rss_x_data_parallel'), '.2f')} | {_cpu(r)} | "
            f"{fmt(r.get('host_steal_share'), '.1%')} | {fmt(r['val_auc'], '.4f')} |"
        )
    return "\n".join(lines)


def _cpu(row) -> str:
    """The CPU cell: seconds per 1,000 samples (kernel share), empty where not measured."""
    if row.get("cpu_per_1000_samples") is None:
        return ""
    return f"{row['cpu_per_1000_samples']:.3f} ({row['cpu_system_share']:.0%})"


def _label(r) -> str:
    rep = f", repeat {r['repeat'] + 1}" if "repeat" in r else ""
    return f"{r['name']} ({r['optimizer']}, {r['ranks']} rank(s){rep})"


def _breakdowns(args, runs, rows, failed) -> dict:
    """``{optimizer: breakdown}`` of the first ``horovod/<strategy>`` run of each optimizer
    (two launches of :mod:`~merlin_models_de.apps.bench.step_breakdown`: distributed, compute)."""
    found = {}
    if args.breakdown_iterations < 1 or args.np < 2:
        return found
    target = f"horovod/{args.strategies.split(',')[0]}"
    for run in runs:
        if run["name"] != target:
            continue
        parts = [
            {
                "name": f"breakdown-{part}",
                "optimizer": run["optimizer"],
                "ranks": run["ranks"],
                "part": part,
                "args": run["args"]
                + ["--part", part, "--iterations", str(args.breakdown_iterations)],
            }
            for part in step_breakdown.PARTS
        ]
        reports = {
            r["part"]: rep
            for r, rep, _ in finished_runs(
                "merlin_models_de.apps.bench.step_breakdown",
                parts,
                args,
                lambda r: f"{r['name']}-{r['optimizer']}.json",
                _label,
                failed,
            )
        }
        if len(reports) < len(parts):
            continue
        row = rows.get((target, run["optimizer"]))
        fit_step = (args.batch_size * args.np / row["warm_samples_per_second"]) if row else None
        found[run["optimizer"]] = {
            "run": target,
            **step_breakdown.combine(
                reports["distributed"],
                reports["compute"],
                fit_step,
                row and row["warm_step_median"],
            ),
            "reports": reports,
        }
    return found


def main(argv=None) -> int:
    """Runs every benchmark ``--repeats`` times, then the step breakdowns; returns non-zero
    when one failed."""
    quiet_imports()
    args = _parser().parse_args(argv)
    for s in args.strategies.split(","):
        if s not in STRATEGIES:
            print(
                f"error: unknown strategy. Received: --strategies={args.strategies!r}",
                file=sys.stderr,
            )
            return 2
    if not 0 <= args.max_steal <= 1 or args.steal_retries < 0:
        print(
            f"error: --max-steal must be in [0, 1] and --steal-retries >= 0. Received: "
            f"--max-steal={args.max_steal} --steal-retries={args.steal_retries}",
            file=sys.stderr,
        )
        return 2
    if args.repeats < 1:
        print(f"error: --repeats must be >= 1. Received: --repeats={args.repeats}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    runs = _runs(args)
    failed, done = [], {(r["name"], r["optimizer"]): [] for r in runs}
    repeated = [{**r, "repeat": k} for k in range(args.repeats) for r in runs]
    for run, rep, seconds in unstolen_runs(
        "merlin_models_de.apps.dlrm",
        repeated,
        args,
        lambda r: f"{r['name'].replace('/', '_')}-{r['optimizer']}-{r['repeat'] + 1}.json",
        _label,
        failed,
    ):
        # the round, so that ratios pair a repeat with the reference's of the same round
        done[(run["name"], run["optimizer"])].append(
            ({**rep, "bench_round": run["repeat"]}, seconds)
        )
        stolen = rep.get("warm_host_steal_share")
        print(
            f"   {rep['warm_samples_per_second']:,.0f} samples/s warm, first step after "
            f"{rep['time_to_first_step']:.1f} s, run {seconds:.0f} s"
            + ("" if stolen is None else f", host CPU stolen {stolen:.1%}"),
            flush=True,
        )
    rows = {}
    for run in runs:
        key = (run["name"], run["optimizer"])
        if done[key]:
            rows[key] = _row(
                run,
                done[key],
                rows.get(("single", run["optimizer"])),
                rows.get(("data-parallel", run["optimizer"])),
            )
    breakdowns = _breakdowns(args, runs, rows, failed)
    table = "\n\n".join(
        [markdown(list(rows.values()))]
        + [
            step_breakdown.markdown(f"{b['run']}, {opt}, {args.np} ranks x {args.batch_size}", b)
            for opt, b in breakdowns.items()
        ]
    )
    print(table)
    write_results(
        args.out,
        "bench",
        table,
        {
            "config": vars(args),
            "rows": list(rows.values()),
            "breakdown": breakdowns,
            "failed": failed,
            "command": " ".join(
                [program_name("merlin_models_de.apps.bench"), *(argv or sys.argv[1:])]
            ),
        },
    )
    print(
        bench_png(
            list(rows.values()), os.path.join(args.out, "bench.png"), _capacity_rows(args.out)
        )
    )
    return 1 if failed else 0


def _capacity_rows(out: str) -> list[dict] | None:
    """The rows of a capacity search written to the same directory, if one ran there."""
    path = os.path.join(out, "capacity.json")
    return read_json(path, "The capacity search")["rows"] if os.path.exists(path) else None


if __name__ == "__main__":
    sys.exit(main())
