"""Next-item benchmark: a sharded item table and vocab-parallel softmax against Merlin's own.

Runs the next-item command (``merlin_models_de.apps.next_item``) on the same synthetic
sessions and the same global batches:

- ``single``: one process, ``mm.Embeddings`` and Merlin's full softmax, global batch N*B;
- ``data-parallel``: N ranks, ``mm.Embeddings`` (every rank holds the table and computes the
  full ``[B, catalog]`` softmax; the table's gradient is allreduced every step);
- ``sharded``: N ranks, ``DistributedEmbeddings`` with the item table row-sliced, the softmax
  vocab-parallel;
- ``sharded, sampled (global in-batch)`` (``--skip sampled`` leaves it out): the same table
  trained with ``mm.ContrastiveOutput`` and every rank's in-batch positives as negatives;
  its recall@10 is still the full catalog's (a twin with the softmax output evaluates).

Speed is global samples/s over every epoch's steps after its first (which traces the step),
with ratios to ``single`` and ``data-parallel``; memory is each rank's embedding bytes and
peak resident memory, with ratios of the busiest rank's peak. Output: a markdown table on
stdout and in ``<out>/bench_next_item.md``, everything in ``<out>/bench_next_item.json``
(``--out``: default ``runs/bench``, git-ignored; ``--out bench/<name>`` for published results).

Example:
    python -m merlin_models_de.apps.bench.next_item --np 2 --items 200000
"""

from __future__ import annotations

import argparse
import os
import sys

from merlin_models_de.apps.bench.runs import (
    DEFAULT_OUT,
    OUT_HELP,
    baseline_and_ranks_args,
    finished_runs,
    write_results,
)
from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.optimizers import LEARNING_RATES
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.tables import human_bytes

SAMPLED = "sharded, sampled (global in-batch)"
RUNS = ("single", "data-parallel", "sharded", SAMPLED)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=program_name("merlin_models_de.apps.bench.next_item"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--np", type=int, default=2, help="ranks of the multi-process runs")
    ap.add_argument("--hosts", default=None, help="horovodrun -H (default localhost:NP)")
    ap.add_argument("--network-interface", default=None)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=20_480)
    ap.add_argument("--batch-size", type=int, default=512, help="sessions per rank per step")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--encoder", default="gru")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of runs to leave out (single, data-parallel, sharded, sampled)",
    )
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument("--out", default=DEFAULT_OUT, help=OUT_HELP)
    return ap


def _runs(args) -> list[dict]:
    n, lr = args.np, LEARNING_RATES[args.optimizer]
    base = [
        "--items",
        str(args.items),
        "--dim",
        str(args.dim),
        "--sessions",
        str(args.sessions),
        "--epochs",
        str(args.epochs),
        "--optimizer",
        args.optimizer,
        "--encoder",
        args.encoder,
        "--quiet",
    ]
    single, dist = baseline_and_ranks_args(base, args.batch_size, lr, n)
    runs = [
        {"name": "single", "ranks": 1, "args": single},
        {"name": "data-parallel", "ranks": n, "args": dist + ["--embeddings", "merlin"]},
        {"name": "sharded", "ranks": n, "args": dist + ["--embeddings", "distributed"]},
        {
            "name": SAMPLED,
            "ranks": n,
            "args": dist + ["--embeddings", "distributed", "--loss", "sampled"],
        },
    ]
    skip = set(filter(None, args.skip.split(",")))
    return [r for r in runs if _key(r["name"]) not in skip]


def _key(name: str) -> str:
    """A run's short name, for --skip and its report's file name."""
    return "sampled" if name == SAMPLED else name


def row(name: str, ranks: int, rep: dict, refs: dict) -> dict:
    """One result row, with ratios to the reference rows in ``refs`` (by run name)."""
    last = rep["epochs"][-1]
    val = rep.get("val") or {}
    out = {
        "run": name,
        "ranks": ranks,
        "warm_samples_per_second": rep["warm_samples_per_second"],
        "embedding_bytes_per_rank": last["embedding_bytes"],
        "peak_rss_per_rank": last["peak_rss_bytes"],
        "embedding_fraction": max(last["embedding_bytes"]) / rep["total_embedding_bytes"],
        "item_table": rep["item_table_kind"],
        "final_loss": rep["final_loss"],
        "recall_at_10": val.get("recall_at_10"),
        "ndcg_at_10": val.get("ndcg_at_10"),
        # --loss sampled: its own evaluate's recall, among the global batch's items
        "sampled_recall_at_10": (rep.get("val_sampled") or {}).get("recall_at_10"),
    }
    for key, ref in refs.items():
        out[f"x_{key}"] = out["warm_samples_per_second"] / ref["warm_samples_per_second"]
        out[f"rss_x_{key}"] = max(out["peak_rss_per_rank"]) / max(ref["peak_rss_per_rank"])
    return out


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""
    head = (
        "| run | ranks | item table | warm samples/s | x single | x data-parallel | "
        "emb bytes/rank (max, share) | peak RSS/rank (max) | RSS x single | "
        "RSS x data-parallel | loss | recall@10 | ndcg@10 |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['ranks']} | {r['item_table']} | "
            f"{fmt(r['warm_samples_per_second'], ',.0f')} | {fmt(r.get('x_single'), '.2f')} | "
            f"{fmt(r.get('x_data-parallel'), '.2f')} | "
            f"{human_bytes(max(r['embedding_bytes_per_rank']))} ({r['embedding_fraction']:.2f}) "
            f"| {human_bytes(max(r['peak_rss_per_rank']))} | {fmt(r.get('rss_x_single'), '.2f')} "
            f"| {fmt(r.get('rss_x_data-parallel'), '.2f')} | {fmt(r['final_loss'], '.4f')} | "
            f"{fmt(r['recall_at_10'], '.4f')} | {fmt(r['ndcg_at_10'], '.4f')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Runs the rows in turn; returns non-zero when one failed."""
    quiet_imports()
    args = _parser().parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows, failed, refs = [], [], {}
    for run, rep, seconds in finished_runs(
        "merlin_models_de.apps.next_item",
        _runs(args),
        args,
        lambda r: f"next_item-{_key(r['name'])}.json",
        lambda r: f"{r['name']} ({r['ranks']} rank(s))",
        failed,
    ):
        result = row(
            run["name"], run["ranks"], rep, {k: v for k, v in refs.items() if k != run["name"]}
        )
        if run["name"] in ("single", "data-parallel"):
            refs[run["name"]] = result
        rows.append(result)
        print(
            f"   {result['warm_samples_per_second']:,.0f} samples/s warm, run {seconds:.0f} s",
            flush=True,
        )
    table = markdown(rows)
    print(table)
    write_results(
        args.out, "bench_next_item", table, {"config": vars(args), "rows": rows, "failed": failed}
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
