"""The next-item command: option errors before TensorFlow, synthetic sessions that do not depend
on the world size, a tiny run in one process and one under ``horovodrun -np 2`` (the item table
row-sliced, vocab-parallel softmax, evaluate's top-k metrics in the report)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from merlin_models_de.apps import next_item
from merlin_models_de.apps.next_item_data import make_sessions
from merlin_models_de.apps.synthetic import rank_rows

HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
TINY = ["--items", "2000", "--dim", "8", "--mlp", "16", "--sessions", "1024",
        "--valid-sessions", "256", "--epochs", "1", "--quiet"]
ENV = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")


def _run(args, ranks=1, timeout=300):
    cmd = [sys.executable, "-m", "merlin_models_de.apps.next_item", *args]
    if ranks > 1:  # local ranks: Gloo and the driver address on loopback
        cmd = [HOROVODRUN, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
               "--network-interface", "lo", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV,
                          check=False)


def _main(argv, capsys):
    try:
        code = next_item.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv, message", [
    (["--encoder", "lstm"], "argument --encoder: invalid choice: 'lstm'"),
    (["--items", "2"], "--items must be >= 3 (id 0 is padding). Received: --items=2"),
    (["--max-length", "1"], "--max-length must be >= 2. Received: --max-length=1"),
    (["--batch-size", "0"], "--batch-size must be >= 1. Received: --batch-size=0"),
    (["--sessions", "100"], "--sessions must hold at least one global batch (batch size 512 "
                            "x 1 ranks). Received: --sessions=100"),
    (["--valid-sessions", "10"], "--valid-sessions must be 0 or hold at least one global batch"),
    (["--valid-sessions", "-1"], "--valid-sessions must be >= 0. Received: --valid-sessions=-1"),
    (["--learning-rate", "nan"], "--learning-rate must be a finite number > 0. "
                                 "Received: --learning-rate=nan"),
    (["--encoder", "transformer", "--dim", "64", "--heads", "3"],
     "--heads must divide the transformer width 64. Received: --heads=3"),
    (["--row-slice-threshold", "0"], "row_slice_threshold"),
    (["--mlp", "0"], "argument --mlp: expected positive integers like '128,64', got '0'"),
])
def test_bad_options_exit_2_with_one_line_before_tensorflow(argv, message, capsys):
    had_tf = "tensorflow" in sys.modules
    code, err = _main(argv, capsys)
    assert code == 2
    assert len(err) == 1 and message in err[0], err
    assert had_tf or "tensorflow" not in sys.modules


def test_transformer_without_transformers_is_refused(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # not importable
    code, err = _main(["--encoder", "transformer"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("error: --encoder transformer needs the transformers package (pip install "
                      "transformers==4.33.3). Received: --encoder=transformer")


def test_every_rank_exits_2_and_only_rank_0_speaks(monkeypatch, capsys):
    said = {}
    for rank in (0, 1):
        monkeypatch.setenv("HOROVOD_RANK", str(rank))
        monkeypatch.setenv("HOROVOD_SIZE", "2")
        code, said[rank] = _main(["--sessions", "600"], capsys)  # < 512 x 2
        assert code == 2
    assert said[1] == [] and len(said[0]) == 1, said
    assert "(batch size 512 x 2 ranks). Received: --sessions=600" in said[0][0]


def test_sessions_do_not_depend_on_world_size():
    whole = make_sessions(5000, 8, rank_rows(9000, 1000, 1, 0), seed=3)
    parts = [make_sessions(5000, 8, rank_rows(9000, 500, 2, r), seed=3) for r in range(2)]
    assert len(whole["lengths"]) == 9000 and whole["lengths"].sum() == len(whole["values"])
    assert whole["lengths"].min() == 2 and whole["lengths"].max() == 8
    assert whole["values"].min() >= 1 and whole["values"].max() < 5000

    def sessions(s):
        offsets = np.concatenate([[0], np.cumsum(s["lengths"])])
        return [tuple(s["values"][a:z]) for a, z in zip(offsets[:-1], offsets[1:])]

    per_rank = [sessions(p) for p in parts]  # global batch k = rank 0's k-th, then rank 1's
    glued = [s for k in range(9) for p in per_rank for s in p[k * 500:(k + 1) * 500]]
    assert glued == sessions(whole)
    # Zipf-like: the 10 most frequent items are a large share of all draws
    counts = np.sort(np.bincount(whole["values"]))[::-1]
    assert counts[:10].sum() / counts.sum() > 0.2


def test_one_process_tiny_run_reports_speed_loss_and_top_k(tmp_path):
    path = str(tmp_path / "r.json")
    run = _run([*TINY, "--batch-size", "128", "--report", path])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "epoch 1:" in run.stdout and "val_recall_at_10=" in run.stdout
    report = json.load(open(path, encoding="utf-8"))
    assert report["world_size"] == 1 and report["steps_per_epoch"] == 8
    assert report["valid_steps"] == 2 and report["item_table_kind"] == "TABLE_WISE"
    (epoch,) = report["epochs"]
    assert epoch["embedding_bytes"] == [2000 * 8 * 4] == [report["total_embedding_bytes"]]
    assert epoch["peak_rss_bytes"][0] > 0 and report["warm_samples_per_second"] > 0
    assert math.isfinite(report["final_loss"])
    assert {"loss", "recall_at_10", "ndcg_at_10"} <= set(report["val"])
    assert 0.0 <= report["val"]["recall_at_10"] <= 1.0


def test_two_ranks_shard_the_item_table_by_rows(tmp_path):
    path = str(tmp_path / "r.json")
    run = _run([*TINY, "--batch-size", "64", "--report", path], ranks=2, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("epoch 1:") == 1  # rank 0 reports
    report = json.load(open(path, encoding="utf-8"))
    assert report["world_size"] == 2 and report["global_batch"] == 128
    assert report["item_table_kind"] == "ROW_WISE" and report["backend"] == "horovod"
    per_rank = report["epochs"][-1]["embedding_bytes"]
    assert per_rank == [1000 * 8 * 4] * 2 and sum(per_rank) == report["total_embedding_bytes"]
    assert len(report["epochs"][-1]["peak_rss_bytes"]) == 2
    assert math.isfinite(report["final_loss"]) and report["final_loss"] > 0
    assert 0.0 <= report["val"]["recall_at_10"] <= 1.0
    assert math.isfinite(report["val"]["ndcg_at_10"])


def test_bench_rows_give_speed_and_memory_ratios():
    from merlin_models_de.apps.bench_next_item import markdown, row

    def report(sps, rss, emb, kind):
        return {"warm_samples_per_second": sps, "total_embedding_bytes": 1000, "final_loss": 7.0,
                "item_table_kind": kind, "val": {"recall_at_10": 0.3, "ndcg_at_10": 0.2},
                "epochs": [{"embedding_bytes": emb, "peak_rss_bytes": rss}]}

    single = row("single", 1, report(100.0, [800], [1000], "DATA_PARALLEL"), {})
    dp = row("data-parallel", 2, report(110.0, [500, 400], [1000, 1000], "DATA_PARALLEL"),
             {"single": single})
    sharded = row("sharded", 2, report(440.0, [100, 120], [500, 500], "ROW_WISE"),
                  {"single": single, "data-parallel": dp})
    assert sharded["x_single"] == pytest.approx(4.4)
    assert sharded["x_data-parallel"] == pytest.approx(4.0)
    assert sharded["rss_x_single"] == pytest.approx(0.15)  # busiest rank's peak over the ref's
    assert sharded["rss_x_data-parallel"] == pytest.approx(0.24)
    assert sharded["embedding_fraction"] == 0.5 and dp["embedding_fraction"] == 1.0
    table = markdown([single, dp, sharded])
    assert "| sharded | 2 | ROW_WISE | 440 | 4.40 | 4.00 |" in table
