"""The next-item command run as a subprocess: a tiny run in one process and one under
``horovodrun -np 2`` (the item table row-sliced, vocab-parallel softmax, evaluate's top-k
metrics in the report), a resume from its checkpoint, parquet input (``--train-dir``) in one
process and on 2 ranks with the sampled loss (its option errors: tests/unit/test_next_item.py)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from merlin_models_de.apps.next_item.data import make_sessions
from tests.commands.launch import HOROVODRUN
from tests.commands.launch import QUIET_ENV as ENV

TINY = [
    "--items",
    "2000",
    "--dim",
    "8",
    "--mlp",
    "16",
    "--sessions",
    "1024",
    "--valid-sessions",
    "256",
    "--epochs",
    "1",
    "--quiet",
]


def _run(args, ranks=1, timeout=300):
    cmd = [sys.executable, "-m", "merlin_models_de.apps.next_item", *args]
    if ranks > 1:  # local ranks: Gloo and the driver address on loopback
        cmd = [
            HOROVODRUN,
            "--gloo",
            "-np",
            str(ranks),
            "-H",
            f"localhost:{ranks}",
            "--network-interface",
            "lo",
            *cmd,
        ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=ENV, check=False
    )


@pytest.mark.full  # 2 ranks row-sharding the item table: also the sampled-loss run below
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


def check_one_process_tiny_report(run, path):
    """What a one-process run of TINY with batch 128 reports: speed, loss, top-k metrics."""
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


def test_a_run_resumes_from_its_checkpoint_at_the_next_epoch(tmp_path):
    """The first run (one process, what it reports checked) saves after its epoch; the
    second, asked for 2 epochs, restores that checkpoint (step 8 of 8 per epoch) and trains
    only epoch 2."""
    ckpt, first, second = str(tmp_path / "ckpt"), str(tmp_path / "1.json"), str(tmp_path / "2.json")
    common = [*TINY[:-3], "--batch-size", "128", "--quiet", "--checkpoint-dir", ckpt]
    run = _run([*common, "--epochs", "1", "--report", first])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check_one_process_tiny_report(run, first)
    assert json.load(open(first, encoding="utf-8"))["resumed"] is None
    latest = open(os.path.join(ckpt, "latest"), encoding="utf-8").read().strip()
    assert latest == "ckpt-000000008"
    run = _run([*common, "--epochs", "2", "--report", second])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{latest} (step 8, epoch 1)" in run.stdout
    report = json.load(open(second, encoding="utf-8"))
    assert report["resumed"]["step"] == 8 and report["resumed"]["epoch"] == 1
    assert [e["epoch"] for e in report["epochs"]] == [2] and report["epochs"][0]["steps"] == 8
    assert open(os.path.join(ckpt, "latest"), encoding="utf-8").read().strip() == ("ckpt-000000016")


def _write_sessions(path, sessions, seed, items=500, parts=2):
    """Parquet sessions with a Merlin schema, as NVTabular writes them: a session id and the
    item-id list column (tags ITEM, ID, a list) among other columns."""
    import pandas as pd
    from merlin.io import Dataset
    from merlin.schema import ColumnSchema, Schema, Tags

    s = make_sessions(items, 6, [(0, sessions)], seed=seed)
    offsets = np.concatenate([[0], np.cumsum(s["lengths"])])
    frame = pd.DataFrame(
        {
            "session_id": np.arange(sessions),
            "item_list": [s["values"][a:z] for a, z in zip(offsets[:-1], offsets[1:])],
        }
    )
    ds = Dataset(frame, npartitions=parts)
    ds.schema = Schema(
        [  # no CATEGORICAL / SEQUENCE tags: the command adds what it needs
            ColumnSchema(
                "session_id",
                dtype=np.int64,
                tags=[Tags.SESSION_ID],
                properties={"domain": {"min": 0, "max": sessions - 1}},
            ),
            ColumnSchema(
                "item_list",
                dtype=np.int64,
                tags=[Tags.ITEM, Tags.ID],
                is_list=True,
                is_ragged=True,
                properties={"domain": {"min": 0, "max": items - 1}},
            ),
        ]
    )
    ds.to_parquet(str(path), output_files=parts)
    return str(path)


@pytest.fixture(scope="module")
def parquet_sessions(tmp_path_factory):
    root = tmp_path_factory.mktemp("sessions")
    return (
        _write_sessions(root / "train", 1024, seed=0),
        _write_sessions(root / "valid", 256, seed=1),
    )


PARQUET = ["--dim", "8", "--mlp", "16", "--epochs", "1", "--quiet"]


@pytest.mark.full  # the one-process report: also test_a_run_resumes_from_its_checkpoint...
def test_parquet_sessions_train_in_one_process(parquet_sessions, tmp_path):
    train, valid = parquet_sessions
    path = str(tmp_path / "r.json")
    run = _run(
        [
            "--train-dir",
            train,
            "--valid-dir",
            valid,
            *PARQUET,
            "--batch-size",
            "128",
            "--report",
            path,
        ]
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "epoch 1:" in run.stdout and "val_recall_at_10=" in run.stdout
    report = json.load(open(path, encoding="utf-8"))
    # the catalog from the schema's domain, the item column found by its tags
    assert report["item_column"] == "item_list" and report["options"]["items"] == 500
    assert report["total_embedding_bytes"] == 500 * 8 * 4
    assert report["steps_per_epoch"] == 1024 // 128 and report["valid_steps"] == 256 // 128
    assert math.isfinite(report["final_loss"]) and report["final_loss"] > 0
    assert 0.0 <= report["val"]["recall_at_10"] <= 1.0 and report["val_sampled"] is None


@pytest.mark.full  # 2 ranks: the horovod stage's next-item models (test_session_fit.py)
def test_two_ranks_train_parquet_sessions_with_the_sampled_loss(parquet_sessions, tmp_path):
    """Each rank reads its own partition; the sampled loss takes every rank's positives as
    negatives; recall@10 is the full catalog's (a twin with the softmax output evaluates),
    the sampled loss's own evaluate is reported apart."""
    train, valid = parquet_sessions
    path = str(tmp_path / "r.json")
    run = _run(
        [
            "--train-dir",
            train,
            "--valid-dir",
            valid,
            *PARQUET,
            "--batch-size",
            "64",
            "--loss",
            "sampled",
            "--report",
            path,
        ],
        ranks=2,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("epoch 1:") == 1 and "val_sampled_recall_at_10=" in run.stdout
    report = json.load(open(path, encoding="utf-8"))
    assert report["world_size"] == 2 and report["item_table_kind"] == "ROW_WISE"
    assert report["loss"] == "sampled" and report["global_batch"] == 128
    assert report["steps_per_epoch"] == 512 // 64 and report["valid_steps"] == 128 // 64
    assert report["epochs"][-1]["embedding_bytes"] == [250 * 8 * 4] * 2
    # sampled: softmax over the global batch's 128 positives, about log(128) untrained
    assert abs(report["final_loss"] - math.log(128)) < 0.5
    # full catalog: a softmax over 500 items, about log(500) after 8 steps
    assert abs(report["val"]["loss"] - math.log(500)) < 0.5
    for val in (report["val"], report["val_sampled"]):
        assert 0.0 <= val["recall_at_10"] <= 1.0 and math.isfinite(val["ndcg_at_10"])
