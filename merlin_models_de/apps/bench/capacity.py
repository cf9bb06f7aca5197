"""Capacity search: the largest Criteo-like DLRM (every table's rows times a scale) that trains
20 steps on this host within a memory budget, for each way of placing the tables.

Configurations (the DLRM command, Adagrad, dim 16, batch 512 a rank):

- ``single``: one process, ``mm.Embeddings`` (every table in the one process);
- ``data-parallel``: N ranks, ``mm.Embeddings`` (every rank holds every table: Merlin today);
- ``sharded``: N ranks, ``DistributedEmbeddings`` (each rank its share);
- ``sharded-<M>``: M ranks, sharded, oversubscribed on this host's cores (slow, not measured
  for speed: only its memory counts here).

A configuration may name its own optimizer and the block's table dtype after colons, e.g.
``sharded:rowwise_adagrad:bfloat16`` (row-wise Adagrad, tables stored in 16 bits); the others
train with ``--optimizer`` and float32 tables. A sharded configuration may also say
``dynamic`` (``sharded:dynamic``): the ``--dynamic`` tables (default ``C1,C10``, two of
Criteo's four largest) are then dynamic tables (docs/dynamic.md) whose capacity is their
scaled cardinality, so a key map of every rank's share is planned beside its rows
(:data:`~merlin_models_de.planner.types.KEY_MAP_BYTES_PER_ROW`) and measured.

All ranks of a run share this host, so the budget bounds the sum of their resident memory (a
watchdog polls it and stops a run that crosses it: "over budget"); on a cluster each rank has
its own device, and the per-rank peak is what a device must hold. For each configuration the
scale doubles until a run fails, then the gap is halved ``--refine`` times. Beside every run:
the plan's predicted peak per rank (:mod:`merlin_models_de.planner.memory`, what the plan
command prints) and the measured peak (each rank's ``ru_maxrss``, from the command's report).

Results go to ``--out`` (default ``runs/bench``, git-ignored; ``--out bench/capacity``
rewrites the published ones).

Example:
    python -m merlin_models_de.apps.bench.capacity --budget 22GiB
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from merlin_models_de.apps.bench.plots import capacity_png
from merlin_models_de.apps.bench.runs import DEFAULT_OUT, OUT_HELP, horovodrun, write_results
from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.optimizers import OPTIMIZERS
from merlin_models_de.apps.common.options import parse_bytes
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.persistence.io import read_json
from merlin_models_de.tables import TABLE_DTYPES

MODULE = "merlin_models_de.apps.dlrm"  # the DLRM command, run as a process
DYNAMIC = "dynamic"  # the configuration's extra that makes the --dynamic tables dynamic
DEFAULT_DYNAMIC = "C1,C10"  # two of Criteo's four 10M-row tables (docs/dynamic.md's runs)


def dynamic_features(config: dict, args) -> list[str]:
    """The features whose tables are dynamic in ``config``: ``--dynamic``'s, or none."""
    if not config.get("dynamic"):
        return []
    return [f for f in getattr(args, "dynamic", DEFAULT_DYNAMIC).split(",") if f]


def dynamic_options(config: dict, schema, args) -> dict:
    """``{feature: DynamicTable}`` of ``config`` on ``schema`` (the scaled one): each at its
    column's cardinality, as the DLRM command's ``--dynamic FEATURE`` without a capacity.

    Raises:
        ValueError: naming a ``--dynamic`` feature that is not a table of the schema.
    """
    from merlin_models_de.tables import DynamicTable

    out = {}
    for name in dynamic_features(config, args):
        column = schema[name] if name in schema.column_names else None
        if column is None or column.int_domain is None or column.int_domain.max is None:
            raise ValueError(
                f"--dynamic names {name!r}, which is not a table of the schema (tables: "
                f"{sorted(c.name for c in schema if c.int_domain is not None)}). "
                f"Received: --dynamic={args.dynamic!r}"
            )
        out[name] = DynamicTable(capacity=int(column.int_domain.max) + 1)
    return out


def configurations(names: str, np_: int, optimizer: str = "adagrad") -> list[dict]:
    """``[{name, ranks, embeddings, optimizer, table_dtype, dynamic}]`` for the comma list
    ``names`` (each ``placement[:optimizer][:table dtype][:dynamic]``; ``optimizer`` where
    none is named; ``dynamic``: the search's ``--dynamic`` tables are dynamic)."""
    known = {
        "single": (1, "merlin"),
        "data-parallel": (np_, "merlin"),
        "sharded": (np_, "distributed"),
    }
    out = []
    for name in filter(None, names.split(",")):
        placement, *extras = name.split(":")
        config = {"name": name, "optimizer": optimizer, "table_dtype": None, "dynamic": False}
        if placement.startswith("sharded-") and placement[len("sharded-") :].isdigit():
            config.update(ranks=int(placement[len("sharded-") :]), embeddings="distributed")
        elif placement in known:
            config.update(zip(("ranks", "embeddings"), known[placement]))
        else:
            raise ValueError(
                f"Unknown configuration; expected single, data-parallel, sharded "
                f"or sharded-<ranks>. Received: --configs={names!r}"
            )
        for extra in extras:
            if extra in OPTIMIZERS:
                config["optimizer"] = extra
            elif extra in TABLE_DTYPES:
                config["table_dtype"] = extra
            elif extra == DYNAMIC:
                config["dynamic"] = True
            else:
                raise ValueError(
                    f"Configuration {name!r}: {extra!r} is neither an optimizer "
                    f"({', '.join(OPTIMIZERS)}), a table dtype ({', '.join(TABLE_DTYPES)}) "
                    f"nor {DYNAMIC!r}. Received: --configs={names!r}"
                )
        if config["dynamic"] and config["embeddings"] != "distributed":
            raise ValueError(
                f"Configuration {name!r}: only a sharded configuration has dynamic tables "
                f"(mm.Embeddings has none). Received: --configs={names!r}"
            )
        out.append(config)
    return out


def predicted_peaks(config: dict, scale: float, args) -> list[int]:
    """The plan's predicted peak bytes of each rank for ``config`` at ``scale``."""
    from merlin_models_de.apps.common.schemas import synthetic_schema
    from merlin_models_de.apps.common.synthetic import capped_schema
    from merlin_models_de.planner import plan
    from merlin_models_de.planner.memory import plan_peak_bytes, replicated_peak_bytes
    from merlin_models_de.tables import narrow_table_bytes, tables_from_schema

    schema = capped_schema(synthetic_schema("criteo"), None, scale)
    tables = tables_from_schema(
        schema, dim=args.dim, dynamic=dynamic_options(config, schema, args) or None
    )
    optimizer = config.get("optimizer", args.optimizer)
    if config["embeddings"] == "merlin":
        return [replicated_peak_bytes(tables, optimizer, config["ranks"])] * config["ranks"]
    table_bytes = narrow_table_bytes(config.get("table_dtype"))
    # the step the run's DLRM command places for (its --batch-size and optimizer)
    step = dict(batch_size=args.batch_size, optimizer=optimizer)
    placement = plan(tables, config["ranks"], strategy=args.strategy, **step)
    return plan_peak_bytes(placement, optimizer, table_bytes=table_bytes)


def _tree(pid: int) -> list:
    """A process and all its descendants ([] once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (0 once it is gone)."""
    import psutil

    total = 0
    for p in _tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def command(config: dict, scale: float, args, report: str) -> list[str]:
    """The DLRM command line of one run of ``config`` at ``scale`` (its report to ``report``)."""
    steps_rows = args.steps * args.batch_size * config["ranks"]
    cmd = [
        sys.executable,
        "-m",
        MODULE,
        "--rows",
        str(steps_rows),
        "--valid-rows",
        "0",
        "--epochs",
        "1",
        "--table-scale",
        str(scale),
        "--dim",
        str(args.dim),
        "--optimizer",
        config.get("optimizer", args.optimizer),
        "--batch-size",
        str(args.batch_size),
        "--embeddings",
        config["embeddings"],
        "--quiet",
        "--report",
        report,
    ]
    if config["embeddings"] == "distributed":
        cmd += ["--strategy", args.strategy]
    if config.get("table_dtype"):
        cmd += ["--table-dtype", config["table_dtype"]]
    for feature in dynamic_features(config, args):  # at its scaled cardinality
        cmd += ["--dynamic", feature]
    return horovodrun(config["ranks"], cmd) if config["ranks"] > 1 else cmd


def run_once(config: dict, scale: float, args, report: str) -> dict:
    """One 20-step run; ``{"ok", "why", "seconds", "host_peak", "rank_peaks"}``."""
    import psutil

    cmd = command(config, scale, args, report)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    if os.path.exists(report):
        os.remove(report)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    host_peak, why = 0, None
    while proc.poll() is None:
        host_peak = max(host_peak, tree_rss(proc.pid))
        if host_peak > args.budget_bytes:
            why = f"over budget ({host_peak / 2**30:.1f} GiB)"
        elif time.perf_counter() - start > args.timeout:
            why = f"timed out after {args.timeout} s"
        if why:
            for p in _tree(proc.pid):
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            break
        time.sleep(0.1)
    output = proc.communicate()[0]
    seconds = time.perf_counter() - start
    if why is None and proc.returncode != 0:
        why = f"exit {proc.returncode}: {output.strip().splitlines()[-1:] or ''}"
    result = {
        "ok": why is None,
        "why": why,
        "seconds": seconds,
        "host_peak": host_peak,
        "rank_peaks": None,
    }
    if why is None:
        rep = read_json(report, "The DLRM command's report")
        result["rank_peaks"] = rep["epochs"][-1]["peak_rss_bytes"]
        result["embedding_bytes"] = rep["epochs"][-1]["embedding_bytes"]
    return result


def search(config: dict, args) -> list[dict]:
    """Runs at doubling scales until one fails, then halves the gap ``--refine`` times."""
    tried = []

    def attempt(scale):
        print(f"== {config['name']} ({config['ranks']} rank(s)), table scale {scale:g}", flush=True)
        out = run_once(
            config, scale, args, os.path.join(args.out, f"capacity-{config['name']}-{scale:g}.json")
        )
        out.update(scale=scale, predicted=predicted_peaks(config, scale, args))
        peaks = out["rank_peaks"] or []
        print(
            f"   {'trained' if out['ok'] else out['why']} in {out['seconds']:.0f} s; "
            f"host peak {out['host_peak'] / 2**30:.2f} GiB; per rank measured "
            f"{[round(p / 2**30, 2) for p in peaks]} GiB, predicted "
            f"{[round(p / 2**30, 2) for p in out['predicted']]} GiB",
            flush=True,
        )
        tried.append(out)
        return out["ok"]

    good, scale = None, args.start_scale
    while attempt(scale):
        good, scale = scale, scale * 2
    bad = scale
    for _ in range(args.refine if good is not None else 0):
        mid = round((good + bad) / 2, 3)
        if attempt(mid):
            good = mid
        else:
            bad = mid
    return tried


def summary_rows(config: dict, tried: list[dict]) -> dict:
    """The largest scale that trained, its table bytes, measured and predicted peaks."""
    ok = [t for t in tried if t["ok"]]
    best = max(ok, key=lambda t: t["scale"]) if ok else None
    failed_above = min((t["scale"] for t in tried if not t["ok"]), default=None)
    row = {
        "config": config["name"],
        "ranks": config["ranks"],
        "embeddings": config["embeddings"],
        "optimizer": config.get("optimizer"),
        "table_dtype": config.get("table_dtype"),
        "dynamic": config.get("dynamic", False),
        "largest_scale": best and best["scale"],
        "first_failed_scale": failed_above,
        "runs": tried,
    }
    if best:
        measured, predicted = max(best["rank_peaks"]), max(best["predicted"])
        row.update(
            table_bytes=sum(best["embedding_bytes"])
            if config["embeddings"] == "distributed"
            else best["embedding_bytes"][0],
            measured_peak_per_rank=measured,
            predicted_peak_per_rank=predicted,
            prediction_error=(predicted - measured) / measured,
            host_peak=best["host_peak"],
        )
    return row


def markdown(rows: list[dict]) -> str:
    head = (
        "| configuration | ranks | largest table scale that trained (first failed) | "
        "embedding tables (GiB) | measured peak/rank (GiB) | predicted peak/rank (GiB) | "
        "prediction error | host peak (GiB) |"
    )
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for r in rows:
        if r["largest_scale"] is None:
            lines.append(
                f"| {r['config']} | {r['ranks']} | none (from "
                f"{r['first_failed_scale']:g}) | | | | | |"
            )
            continue
        fail = "" if r["first_failed_scale"] is None else f" ({r['first_failed_scale']:g})"
        lines.append(
            f"| {r['config']} | {r['ranks']} | {r['largest_scale']:g}{fail} | "
            f"{r['table_bytes'] / 2**30:.2f} | {r['measured_peak_per_rank'] / 2**30:.2f} | "
            f"{r['predicted_peak_per_rank'] / 2**30:.2f} | {r['prediction_error']:+.1%} | "
            f"{r['host_peak'] / 2**30:.2f} |"
        )
    return "\n".join(lines)


def _predicted_again(args) -> list[dict]:
    """The rows of the search saved in ``--out``, every prediction made again (the runs'
    measurements unchanged), e.g. after the memory model's runtime was fitted to them."""
    saved = read_json(os.path.join(args.out, "capacity.json"), "The capacity search")
    vars(args).update(
        {
            k: v
            for k, v in saved["config"].items()  # the search's own options
            if k not in ("out", "predict_again")
        }
    )
    rows = []
    for row in saved["rows"]:
        config = {k: row[k] for k in ("ranks", "embeddings")} | {"name": row["config"]}
        config |= {k: row[k] for k in ("optimizer", "table_dtype", "dynamic") if k in row}
        for run in row["runs"]:
            run["predicted"] = predicted_peaks(config, run["scale"], args)
        rows.append(summary_rows(config, row["runs"]))
    return rows


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=program_name("merlin_models_de.apps.bench.capacity"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--configs", default="single,data-parallel,sharded,sharded-4")
    ap.add_argument("--np", type=int, default=2, help="ranks of data-parallel and sharded")
    ap.add_argument(
        "--budget", default="22GiB", help="resident memory all ranks of a run may use together"
    )
    ap.add_argument("--start-scale", type=float, default=0.5)
    ap.add_argument("--refine", type=int, default=2, help="halvings between pass and fail")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=512, help="rows per rank per step")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--optimizer", default="adagrad", choices=OPTIMIZERS)
    ap.add_argument("--strategy", default="memory_optimized")
    ap.add_argument(
        "--dynamic",
        default=DEFAULT_DYNAMIC,
        metavar="FEATURE,...",
        help="the tables a configuration with ':dynamic' (e.g. sharded:dynamic) makes "
        "dynamic, each at its scaled cardinality (default %(default)s)",
    )
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per run")
    ap.add_argument("--out", default=DEFAULT_OUT, help=OUT_HELP)
    ap.add_argument(
        "--predict-again",
        action="store_true",
        help="no runs: recompute the predictions of the search in --out with "
        "the current memory model and rewrite its results",
    )
    return ap


def main(argv=None) -> int:
    quiet_imports()
    args = _parser().parse_args(argv)
    try:
        args.budget_bytes = parse_bytes(args.budget, "--budget")
        configs = configurations(args.configs, args.np, args.optimizer)
        for config in configs:  # a --dynamic name not in the schema fails before any run
            predicted_peaks(config, args.start_scale, args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    if args.predict_again:
        rows = _predicted_again(args)
    else:
        rows = [summary_rows(c, search(c, args)) for c in configs]
    table = markdown(rows)
    print(table)
    write_results(args.out, "capacity", table, {"config": vars(args), "rows": rows})
    print(capacity_png(rows, os.path.join(args.out, "capacity.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
