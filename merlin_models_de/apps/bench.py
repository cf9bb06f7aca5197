"""Benchmark harness: DLRM samples/s and per-rank memory against Merlin's own baselines.

Runs, on the same synthetic data and the same steps (the DLRM command, one process per run):

- ``single``: one process, ``mm.Embeddings``, global batch N*B (the compute limit on a host
  whose cores the N ranks share);
- ``data-parallel``: N ranks, ``mm.Embeddings``, batch B each, as Merlin does it today;
- ``horovod/<strategy>``: N ranks, ``DistributedEmbeddings`` with the built-in backend (plus one
  run without id validation, to price the check);
- ``distributed-embeddings/<strategy>``: the same with NVIDIA's engine, where it imports.

Speed is global samples/s over the warm epochs (the first epoch, with tracing and table
initialization, is reported apart), with ratios to ``single`` and ``data-parallel``; memory is
each rank's embedding bytes and peak resident memory. Output: a markdown table on stdout and
in ``<out>/bench.md``, everything in ``<out>/bench.json``.

Example:
    python -m merlin_models_de.bench --np 2 --optimizers sgd,adagrad --out bench/
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from merlin_models_de.apps.console import quiet_imports
from merlin_models_de.apps.defaults import LEARNING_RATES
from merlin_models_de.backends.registry import AUTO, BACKEND_NAMES, is_installed
from merlin_models_de.planner import STRATEGIES
from merlin_models_de.tables import human_bytes


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m merlin_models_de.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2, help="ranks of the multi-process runs")
    ap.add_argument("--hosts", default=None, help="horovodrun -H (default localhost:NP)")
    ap.add_argument("--network-interface", default=None,
                    help="interface the ranks talk over (default: lo when --hosts is not given; "
                         "with --hosts, Horovod's choice)")
    ap.add_argument("--rows", type=int, default=20480)
    ap.add_argument("--batch-size", type=int, default=512, help="rows per rank per step")
    ap.add_argument("--epochs", type=int, default=3, help="1 cold + the rest warm")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--max-table-rows", type=int, default=None)
    ap.add_argument("--optimizers", default="sgd,adagrad")
    ap.add_argument("--strategies", default="memory_optimized")
    ap.add_argument("--column-slice-threshold", type=int, default=2**24)
    ap.add_argument("--skip", default="", help="comma list of runs to leave out, e.g. "
                                               "data-parallel,no-validation")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument("--out", default="bench")
    return ap


def _runs(args) -> list[dict]:
    skip = set(filter(None, args.skip.split(",")))
    n = args.np
    runs = []
    for opt in args.optimizers.split(","):
        base = ["--rows", str(args.rows), "--epochs", str(args.epochs), "--dim", str(args.dim),
                "--optimizer", opt, "--quiet"]
        if args.max_table_rows:
            base += ["--max-table-rows", str(args.max_table_rows)]
        lr = LEARNING_RATES[opt]
        runs.append({"name": "single", "optimizer": opt, "ranks": 1,
                     "args": base + ["--embeddings", "merlin", "--batch-size",
                                     str(args.batch_size * n), "--learning-rate", str(lr * n)]})
        dist = base + ["--batch-size", str(args.batch_size), "--learning-rate", str(lr)]
        runs.append({"name": "data-parallel", "optimizer": opt, "ranks": n,
                     "args": dist + ["--embeddings", "merlin"]})
        backends = [b for b in BACKEND_NAMES if b != AUTO and is_installed(b)]
        for backend in backends:
            for i, strategy in enumerate(args.strategies.split(",")):
                place = dist + ["--backend", backend, "--strategy", strategy,
                                "--column-slice-threshold", str(args.column_slice_threshold)]
                runs.append({"name": f"{backend}/{strategy}", "optimizer": opt, "ranks": n,
                             "args": place})
                if backend == "horovod" and i == 0:
                    runs.append({"name": f"{backend}/{strategy}/no-validation", "optimizer": opt,
                                 "ranks": n, "args": place + ["--no-validate-ids"]})
    return [r for r in runs if r["name"].split("/")[-1] not in skip and r["name"] not in skip]


def horovodrun(ranks: int, command: list, hosts: str | None = None,
               network_interface: str | None = None) -> list:
    """The horovodrun command line for ``command`` on ``ranks`` ranks.

    Local runs (no ``hosts``) keep Gloo's traffic and Horovod's driver address on loopback;
    Horovod's rendezvous server still listens on every interface (no option changes that).

    Example:
        >>> horovodrun(2, ["python", "job.py"])[:7]
        ['horovodrun', '--gloo', '-np', '2', '-H', 'localhost:2', '--network-interface']
    """
    nic = network_interface or (None if hosts else "lo")
    return (["horovodrun", "--gloo", "-np", str(ranks), "-H", hosts or f"localhost:{ranks}"]
            + (["--network-interface", nic] if nic else []) + list(command))


def launch(module: str, run: dict, args, report: str) -> tuple[int, float, str]:
    """Runs ``python -m module`` with the run's options (under horovodrun for several
    ranks), writing its JSON report to ``report``; returns (exit code, seconds, output tail)."""
    cmd = [sys.executable, "-m", module, *run["args"], "--report", report]
    if run["ranks"] > 1:
        cmd = horovodrun(run["ranks"], cmd, args.hosts, args.network_interface)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                              check=False)
        code, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as err:
        code, tail = -1, f"timed out after {args.timeout} s: {str(err.stdout or '')[-2000:]}"
    return code, time.perf_counter() - t0, tail


def finished_runs(module: str, runs: list, args, report_name, label, failed: list):
    """Launches each run in turn; yields ``(run, report dict, seconds)`` of those that
    succeeded and appends the names of the others to ``failed`` (after printing why)."""
    for run in runs:
        report = os.path.join(args.out, report_name(run))
        print(f"== {label(run)}", flush=True)
        code, seconds, tail = launch(module, run, args, report)
        if code != 0:
            print(f"   failed (exit {code}) after {seconds:.0f} s:\n{tail}", flush=True)
            failed.append(run["name"])
            continue
        with open(report, encoding="utf-8") as f:
            yield run, json.load(f), seconds


def write_results(out: str, stem: str, table: str, payload: dict) -> None:
    """``<stem>.json`` (the payload) and ``<stem>.md`` (the table) in ``out``."""
    with open(os.path.join(out, f"{stem}.json"), "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")


def _row(run, rep, single, dp) -> dict:
    sps = rep["warm_samples_per_second"]
    emb, rss = rep["epochs"][-1]["embedding_bytes"], rep["epochs"][-1]["peak_rss_bytes"]
    row = {"run": run["name"], "optimizer": run["optimizer"], "ranks": run["ranks"],
           "warm_samples_per_second": sps,
           "first_epoch_samples_per_second": rep["first_epoch_samples_per_second"],
           "time_to_first_step": rep["time_to_first_step"],
           "embedding_bytes_per_rank": emb, "peak_rss_per_rank": rss,
           "embedding_fraction": max(emb) / rep["total_embedding_bytes"],
           "final_loss": rep["epochs"][-1]["loss"], "val_auc": rep["epochs"][-1]["val_auc"]}
    for key, ref in (("single", single), ("data_parallel", dp)):
        if ref is not None:
            row[f"x_{key}"] = sps / ref["warm_samples_per_second"]
            row[f"rss_x_{key}"] = max(rss) / max(ref["peak_rss_per_rank"])
            row[f"first_step_x_{key}"] = rep["time_to_first_step"] / ref["time_to_first_step"]
    return row


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""
    head = ("| run | opt | ranks | warm samples/s | x single | x data-parallel | 1st epoch "
            "samples/s | time to 1st step (s) | emb bytes/rank (max, share) | peak RSS/rank "
            "(max) | RSS x data-parallel | val AUC |")
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['optimizer']} | {r['ranks']} | "
            f"{fmt(r['warm_samples_per_second'], ',.0f')} | {fmt(r.get('x_single'), '.2f')} | "
            f"{fmt(r.get('x_data_parallel'), '.2f')} | "
            f"{fmt(r['first_epoch_samples_per_second'], ',.0f')} | "
            f"{fmt(r['time_to_first_step'], '.1f')} | "
            f"{human_bytes(max(r['embedding_bytes_per_rank']))} "
            f"({r['embedding_fraction']:.2f}) | {human_bytes(max(r['peak_rss_per_rank']))} | "
            f"{fmt(r.get('rss_x_data_parallel'), '.2f')} | {fmt(r['val_auc'], '.4f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Runs every benchmark in turn; returns non-zero when one failed."""
    quiet_imports()
    args = _parser().parse_args(argv)
    for s in args.strategies.split(","):
        if s not in STRATEGIES:
            print(f"error: unknown strategy. Received: --strategies={args.strategies!r}",
                  file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    rows, failed, refs = [], [], {}
    for run, rep, seconds in finished_runs(
            "merlin_models_de.apps.dlrm", _runs(args), args,
            lambda r: f"{r['name'].replace('/', '_')}-{r['optimizer']}.json",
            lambda r: f"{r['name']} ({r['optimizer']}, {r['ranks']} rank(s))", failed):
        key = (run["name"], run["optimizer"])
        row = _row(run, rep, refs.get(("single", run["optimizer"])),
                   refs.get(("data-parallel", run["optimizer"])))
        refs[key] = row
        rows.append(row)
        print(f"   {row['warm_samples_per_second']:,.0f} samples/s warm, first step after "
              f"{row['time_to_first_step']:.1f} s, run {seconds:.0f} s", flush=True)
    table = markdown(rows)
    print(table)
    write_results(args.out, "bench", table, {
        "config": vars(args), "rows": rows, "failed": failed,
        "command": "python -m merlin_models_de.bench " + " ".join(argv or sys.argv[1:])})
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
