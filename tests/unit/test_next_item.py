"""The next-item command: option errors before TensorFlow, synthetic sessions that do not depend
on the world size, a tiny run in one process and one under ``horovodrun -np 2`` (the item table
row-sliced, vocab-parallel softmax, evaluate's top-k metrics in the report), parquet input
(``--train-dir``: schema errors, runs in one process and on 2 ranks) and the sampled loss.

The tests that load TensorFlow in this process come last, after the ones that check that
option errors come before it."""
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
    (["--loss", "bpr"], "argument --loss: invalid choice: 'bpr'"),
    (["--train-dir", "/d", "--valid-dir", "/v", "--items", "10"],
     "--items is for synthetic sessions, not --train-dir (the catalog and sessions come from "
     "the dataset). Received: --items=10"),
    (["--train-dir", "/d", "--valid-dir", "/v", "--sessions", "9000"],
     "--sessions is for synthetic sessions, not --train-dir"),
    (["--train-dir", "/d"], "--train-dir needs --valid-dir (held-out sessions for recall@10). "
                            "Received: --train-dir='/d'"),
    (["--valid-dir", "/v"], "--valid-dir needs --train-dir. Received: --valid-dir='/v'"),
    (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir. "
                                  "Received: --checkpoint-every=5"),
    (["--checkpoint-dir", "/c", "--checkpoint-keep", "0"],
     "--checkpoint-keep must be >= 1. Received: --checkpoint-keep=0"),
    (["--train-dir", "/no/such/dir", "--valid-dir", "/v"],
     "error: --train-dir is not a directory. Received: --train-dir='/no/such/dir'"),
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
    assert open(os.path.join(ckpt, "latest"), encoding="utf-8").read().strip() == (
        "ckpt-000000016")


def test_bench_runs_the_sampled_row_on_the_sharded_table_unless_skipped():
    from merlin_models_de.apps import bench_next_item as bench

    def runs(*argv):
        return {r["name"]: r for r in bench._runs(bench._parser().parse_args(list(argv)))}

    every = runs("--np", "2")
    assert list(every) == list(bench.RUNS)
    sampled = every["sharded, sampled (global in-batch)"]
    assert sampled["ranks"] == 2
    assert sampled["args"] == every["sharded"]["args"] + ["--loss", "sampled"]
    assert list(runs("--skip", "sampled,single")) == ["data-parallel", "sharded"]


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


def test_a_dataset_directory_without_a_schema_is_refused(tmp_path, capsys):
    (tmp_path / "part_0.parquet").write_bytes(b"")
    code, err = _main(["--train-dir", str(tmp_path), "--valid-dir", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: --train-dir has no Merlin schema (schema.pbtxt or ")
    assert err[0].endswith(f"Received: --train-dir={str(tmp_path)!r}")


# ---- below: TensorFlow loads in this process (Merlin's schema and parquet writers) ----

def _schema_dir(path, columns):
    """A dataset directory holding only a Merlin schema of ``columns`` (ColumnSchemas)."""
    from merlin.schema import Schema
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    os.makedirs(path, exist_ok=True)
    TensorflowMetadata.from_merlin_schema(Schema(columns)).to_proto_text_file(str(path))
    return str(path)


def _item(name, max_id=99, is_list=True, domain=True):
    from merlin.schema import ColumnSchema, Tags

    props = {"domain": {"min": 0, "max": max_id}} if domain else {}
    return ColumnSchema(name, tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL], dtype=np.int64,
                        is_list=is_list, is_ragged=is_list, properties=props)


def test_the_item_column_is_the_one_item_id_list_column_and_its_domain_the_catalog(tmp_path):
    from merlin_models_de.apps.next_item_data import item_sequence_column
    from merlin_models_de.schemas import load_schema

    def column(name, *cols):
        path = _schema_dir(tmp_path / name, cols)
        return item_sequence_column(load_schema(path), "--train-dir", path)

    assert column("ok", _item("items", 499), _item("user_id", is_list=False)) == ("items", 500)
    with pytest.raises(ValueError) as err:
        column("two", _item("a"), _item("b"))
    assert str(err.value) == (
        "--train-dir's schema must have exactly one item-id list column (tags ITEM and ID, a "
        "list); it has 2 such columns ['a', 'b']. Received: --train-dir="
        f"{str(tmp_path / 'two')!r}")
    with pytest.raises(ValueError, match=r"it has none among its columns \['item'\]"):
        column("scalar", _item("item", is_list=False))
    with pytest.raises(ValueError) as err:
        column("no_domain", _item("item", domain=False))
    assert str(err.value).startswith("The item column 'item' in --train-dir's schema has no "
                                     "integer domain max (the catalog is max + 1 rows).")


def test_a_dataset_directory_with_a_schema_only_exits_2_naming_it(tmp_path, capsys):
    train = _schema_dir(tmp_path / "train", [_item("a")])
    code, err = _main(["--train-dir", train, "--valid-dir", train], capsys)
    assert code == 2 and err == [f"error: --train-dir holds no .parquet files (only its "
                                 f"schema?). Received: --train-dir={train!r}"], err


def test_a_catalog_too_big_for_memory_exits_2_with_one_line(capsys):
    code, err = _main(["--items", str(10**12), "--dim", "64"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: The item table (1,000,000,000,000 items x 64 with "
                             "adam's slots, over 1 rank(s)) needs 715255.7 GiB per rank, "
                             "more than the "), err
    assert err[0].endswith("Received: --items=1000000000000"), err


@pytest.mark.parametrize("case, message", [
    ("two item columns", "error: --train-dir's schema must have exactly one item-id list "
                         "column (tags ITEM and ID, a list); it has 2 such columns ['a', 'b']"),
    ("valid without it", "error: --valid-dir's schema has no column 'a' (the item column of "
                         "--train-dir)"),
])
def test_schema_problems_exit_2_with_one_line_naming_the_column(tmp_path, capsys, case,
                                                                message):
    train = [_item("a"), _item("b")] if case == "two item columns" else [_item("a")]
    valid = train if case == "two item columns" else [_item("b")]
    code, err = _main(["--train-dir", _schema_dir(tmp_path / "train", train),
                       "--valid-dir", _schema_dir(tmp_path / "valid", valid)], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(message), err


def _write_sessions(path, sessions, seed, items=500, parts=2):
    """Parquet sessions with a Merlin schema, as NVTabular writes them: a session id and the
    item-id list column (tags ITEM, ID, a list) among other columns."""
    import pandas as pd
    from merlin.io import Dataset
    from merlin.schema import ColumnSchema, Schema, Tags

    s = make_sessions(items, 6, [(0, sessions)], seed=seed)
    offsets = np.concatenate([[0], np.cumsum(s["lengths"])])
    frame = pd.DataFrame({"session_id": np.arange(sessions), "item_list": [
        s["values"][a:z] for a, z in zip(offsets[:-1], offsets[1:])]})
    ds = Dataset(frame, npartitions=parts)
    ds.schema = Schema([  # no CATEGORICAL / SEQUENCE tags: the command adds what it needs
        ColumnSchema("session_id", dtype=np.int64, tags=[Tags.SESSION_ID],
                     properties={"domain": {"min": 0, "max": sessions - 1}}),
        ColumnSchema("item_list", dtype=np.int64, tags=[Tags.ITEM, Tags.ID], is_list=True,
                     is_ragged=True, properties={"domain": {"min": 0, "max": items - 1}})])
    ds.to_parquet(str(path), output_files=parts)
    return str(path)


@pytest.fixture(scope="module")
def parquet_sessions(tmp_path_factory):
    root = tmp_path_factory.mktemp("sessions")
    return (_write_sessions(root / "train", 1024, seed=0),
            _write_sessions(root / "valid", 256, seed=1))


PARQUET = ["--dim", "8", "--mlp", "16", "--epochs", "1", "--quiet"]


@pytest.mark.full  # the one-process report: also test_a_run_resumes_from_its_checkpoint...
def test_parquet_sessions_train_in_one_process(parquet_sessions, tmp_path):
    train, valid = parquet_sessions
    path = str(tmp_path / "r.json")
    run = _run(["--train-dir", train, "--valid-dir", valid, *PARQUET, "--batch-size", "128",
                "--report", path])
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
    run = _run(["--train-dir", train, "--valid-dir", valid, *PARQUET, "--batch-size", "64",
                "--loss", "sampled", "--report", path], ranks=2, timeout=400)
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
