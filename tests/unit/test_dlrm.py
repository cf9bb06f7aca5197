"""The DLRM command: option errors, synthetic data, single-process and horovodrun runs,
checkpoint resume, export, a parquet directory with unequal partitions, the bench harness."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from merlin_models_de.apps import dlrm
from merlin_models_de.apps.synthetic import make_rows, rank_rows

HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
QUICK = ["--max-table-rows", "1000", "--batch-size", "64", "--dim", "8", "--bottom-mlp", "16",
         "--top-mlp", "16", "--quiet"]
ENV = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")


def _run(args, ranks=1, timeout=600):
    cmd = [sys.executable, "-m", "merlin_models_de.dlrm", *args]
    if ranks > 1:
        cmd = [HOROVODRUN, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV,
                          check=False)


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "fastest"], "argument --strategy: invalid choice: 'fastest'"),
    (["--batch-size", "0"], "--batch-size must be >= 1. Received: 0"),
    (["--optimizer", "lamb"], "argument --optimizer: invalid choice: 'lamb'"),
    (["--rows", "100", "--batch-size", "512"], "--rows must hold at least one global batch"),
    (["--valid-dir", "/tmp"], "--valid-dir needs --train-dir"),
    (["--column-slice-threshold", "0"], "column_slice_threshold"),
    pytest.param(["--backend", "distributed-embeddings"], "needs NVIDIA distributed-embeddings",
                 marks=pytest.mark.skipif(importlib.util.find_spec("distributed_embeddings") is not None,
                                          reason="distributed-embeddings is installed")),
])
def test_bad_options_exit_2_with_one_line_before_tensorflow(argv, message, capsys):
    had_tf = "tensorflow" in sys.modules
    try:
        code = dlrm.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and message in err[0], err
    assert had_tf or "tensorflow" not in sys.modules


def test_train_dir_without_schema_is_refused(tmp_path, capsys):
    (tmp_path / "part.parquet").write_bytes(b"")
    assert dlrm.main(["--train-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--train-dir has no Merlin schema" in err and str(tmp_path) in err


def test_synthetic_rows_do_not_depend_on_world_size():
    from merlin_models_de.schemas import synthetic_schema

    schema = synthetic_schema("criteo")
    assert rank_rows(10, per_rank=2, world_size=2, rank=1) == [(2, 4), (6, 8)]
    whole = make_rows(schema, rank_rows(70000, 1000, 1, 0), seed=3)
    parts = [make_rows(schema, rank_rows(70000, 500, 2, r), seed=3) for r in range(2)]
    for name in ("C1", "I1", "label"):
        # global batch k = rank 0's k-th batch, then rank 1's
        glued = np.concatenate([np.concatenate([p[name][k * 500:(k + 1) * 500] for p in parts])
                                for k in range(70)])
        np.testing.assert_array_equal(glued, whole[name])
    assert whole["C1"].max() < 10_000_000 and 0.2 < whole["label"].mean() < 0.8


def test_single_process_run_checkpoint_resume_and_export(tmp_path):
    ckpt, export = str(tmp_path / "ckpt"), str(tmp_path / "export")
    first = _run(["--rows", "1024", "--epochs", "2", "--checkpoint-dir", ckpt, "--export", export,
                  *QUICK])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    auto = ("distributed-embeddings" if importlib.util.find_spec("distributed_embeddings")
            else "horovod")
    assert f"backend={auto}\n" in first.stdout and "epoch 2:" in first.stdout
    report = json.load(open(os.path.join(ckpt, "report.json"), encoding="utf-8"))
    assert [e["epoch"] for e in report["epochs"]] == [1, 2]
    assert report["steps_per_epoch"] == 16 and report["world_size"] == 1
    assert report["epochs"][0]["embedding_bytes"] == [report["total_embedding_bytes"]]
    assert 0.0 <= report["epochs"][1]["val_auc"] <= 1.0
    assert report["time_to_first_step"] > 0 and report["warm_samples_per_second"] > 0
    resumed = _run(["--rows", "1024", "--epochs", "3", "--checkpoint-dir", ckpt, *QUICK])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stdout and "(step 32, epoch 2)" in resumed.stdout
    again = json.load(open(os.path.join(ckpt, "report.json"), encoding="utf-8"))
    assert [e["epoch"] for e in again["epochs"]] == [3]
    import tensorflow as tf

    loaded = tf.keras.models.load_model(export)
    assert loaded is not None


def test_two_ranks_hold_half_the_tables_each(tmp_path):
    report_path = str(tmp_path / "r.json")
    run = _run(["--rows", "2048", "--epochs", "2", "--report", report_path,
                "--strategy", "memory_balanced", *QUICK], ranks=2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("epoch 2:") == 1  # rank 0 reports
    report = json.load(open(report_path, encoding="utf-8"))
    assert report["world_size"] == 2 and report["global_batch"] == 128
    per_rank = report["epochs"][-1]["embedding_bytes"]
    assert sum(per_rank) == report["total_embedding_bytes"]
    assert max(per_rank) <= 0.55 * report["total_embedding_bytes"]
    assert len(report["epochs"][-1]["peak_rss_bytes"]) == 2


def test_two_ranks_bad_option_one_line(tmp_path):
    run = _run(["--strategy", "fastest"], ranks=2, timeout=300)
    assert run.returncode != 0
    lines = [l for l in (run.stdout + run.stderr).splitlines() if "invalid choice" in l]
    assert len(lines) == 1, run.stdout + run.stderr


def test_parquet_dir_with_unequal_partitions_takes_equal_steps(tmp_path):
    from merlin.io import Dataset

    from merlin_models_de.schemas import synthetic_schema
    from merlin_models_de.apps.synthetic import capped_schema, make_rows

    schema = capped_schema(synthetic_schema("criteo"), 1000)
    import pandas as pd

    for name, rows in (("train", 1500), ("valid", 600)):
        frame = pd.DataFrame(make_rows(schema, [(0, rows)], seed=5))
        ds = Dataset(frame, schema=schema, npartitions=3)  # 500 rows each
        ds.to_parquet(str(tmp_path / name))
    report_path = str(tmp_path / "r.json")
    run = _run(["--train-dir", str(tmp_path / "train"), "--valid-dir", str(tmp_path / "valid"),
                "--report", report_path, *QUICK], ranks=2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.load(open(report_path, encoding="utf-8"))
    # 3 partitions on 2 ranks: 1000 and 500 rows -> 15 and 7 batches of 64; both take 7
    assert report["steps_per_epoch"] == 7
    assert "train batches per rank differ [15, 7]" in run.stdout


def test_bench_runs_every_baseline_and_reports_ratios(tmp_path):
    out = str(tmp_path / "bench")
    run = subprocess.run(
        [sys.executable, "-m", "merlin_models_de.bench", "--np", "2", "--rows", "2048",
         "--batch-size", "64", "--epochs", "2", "--max-table-rows", "1000", "--dim", "8",
         "--optimizers", "sgd", "--out", out],
        capture_output=True, text=True, timeout=1200, env=ENV, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    result = json.load(open(os.path.join(out, "bench.json"), encoding="utf-8"))
    rows = {r["run"]: r for r in result["rows"]}
    assert {"single", "data-parallel", "horovod/memory_optimized",
            "horovod/memory_optimized/no-validation"} <= set(rows)
    single, dp, mp = rows["single"], rows["data-parallel"], rows["horovod/memory_optimized"]
    assert mp["x_single"] == pytest.approx(mp["warm_samples_per_second"]
                                           / single["warm_samples_per_second"])
    assert mp["x_data_parallel"] == pytest.approx(mp["warm_samples_per_second"]
                                                  / dp["warm_samples_per_second"])
    assert dp["embedding_fraction"] == pytest.approx(1.0)
    assert mp["embedding_fraction"] <= 0.55
    table = open(os.path.join(out, "bench.md"), encoding="utf-8").read()
    assert all(f"| {name} |" in table for name in rows)
