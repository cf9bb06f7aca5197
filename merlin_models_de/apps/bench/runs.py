"""Launching the benchmarks' runs (one command process, under horovodrun for several ranks)
and writing their results (what the DLRM bench, the next-item bench and the capacity search
share)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

# Where the runs and results go unless --out says otherwise: beside the repository's own files
# (git-ignored), never over the published results in bench/ (--out bench/... writes those)
DEFAULT_OUT = os.path.join("runs", "bench")
OUT_HELP = (
    f"folder of the runs' reports and the results (default {DEFAULT_OUT}, git-ignored; "
    "--out bench/<name> updates the published results docs/benchmarks.md quotes)"
)


def baseline_and_ranks_args(base: list, batch_size: int, lr: float, n: int):
    """``(one process's arguments, each of n ranks' arguments)`` of a comparison: the one
    process trains ``mm.Embeddings`` on the global batch at n times the rate (as Merlin scales
    it for n ranks), so its steps equal the ranks' steps."""
    single = base + ["--embeddings", "merlin", "--batch-size", str(batch_size * n)]
    ranks = base + ["--batch-size", str(batch_size), "--learning-rate", str(lr)]
    return single + ["--learning-rate", str(lr * n)], ranks


def horovodrun(
    ranks: int, command: list, hosts: str | None = None, network_interface: str | None = None
) -> list:
    """The horovodrun command line for ``command`` on ``ranks`` ranks.

    Local runs (no ``hosts``) keep Gloo's traffic and Horovod's driver address on loopback;
    Horovod's rendezvous server still listens on every interface (no option changes that).

    Example:
        >>> horovodrun(2, ["python", "job.py"])[:7]
        ['horovodrun', '--gloo', '-np', '2', '-H', 'localhost:2', '--network-interface']
    """
    nic = network_interface or (None if hosts else "lo")
    return (
        ["horovodrun", "--gloo", "-np", str(ranks), "-H", hosts or f"localhost:{ranks}"]
        + (["--network-interface", nic] if nic else [])
        + list(command)
    )


def launch(module: str, run: dict, args, report: str) -> tuple[int, float, str]:
    """Runs ``python -m module`` with the run's options (under horovodrun for several
    ranks), writing its JSON report to ``report``; returns (exit code, seconds, output tail)."""
    cmd = [sys.executable, "-m", module, *run["args"], "--report", report]
    if run["ranks"] > 1:
        cmd = horovodrun(run["ranks"], cmd, args.hosts, args.network_interface)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False
        )
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
