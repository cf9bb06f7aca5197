"""The next-item command in this process: option errors before TensorFlow, synthetic sessions
that do not depend on the world size, the bench's rows and parquet schema errors (the runs in
one process and under ``horovodrun -np 2``: tests/commands/test_next_item.py).

The tests that load TensorFlow in this process come last, after the ones that check that
option errors come before it."""

import os
import sys

import numpy as np
import pytest

from merlin_models_de.apps.common.synthetic import rank_rows
from merlin_models_de.apps.next_item.__main__ import main as next_item_main
from merlin_models_de.apps.next_item.data import make_sessions


def _main(argv, capsys):
    try:
        code = next_item_main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--encoder", "lstm"], "argument --encoder: invalid choice: 'lstm'"),
        (["--items", "2"], "--items must be >= 3 (id 0 is padding). Received: --items=2"),
        (["--max-length", "1"], "--max-length must be >= 2. Received: --max-length=1"),
        (["--batch-size", "0"], "--batch-size must be >= 1. Received: --batch-size=0"),
        (
            ["--sessions", "100"],
            "--sessions must hold at least one global batch (batch size 512 "
            "x 1 ranks). Received: --sessions=100",
        ),
        (
            ["--valid-sessions", "10"],
            "--valid-sessions must be 0 or hold at least one global batch",
        ),
        (
            ["--valid-sessions", "-1"],
            "--valid-sessions must be >= 0. Received: --valid-sessions=-1",
        ),
        (
            ["--learning-rate", "nan"],
            "--learning-rate must be a finite number > 0. Received: --learning-rate=nan",
        ),
        (
            ["--encoder", "transformer", "--dim", "64", "--heads", "3"],
            "--heads must divide the transformer width 64. Received: --heads=3",
        ),
        (["--row-slice-threshold", "0"], "row_slice_threshold"),
        (["--mlp", "0"], "argument --mlp: expected positive integers like '128,64', got '0'"),
        (["--loss", "bpr"], "argument --loss: invalid choice: 'bpr'"),
        (
            ["--train-dir", "/d", "--valid-dir", "/v", "--items", "10"],
            "--items is for synthetic sessions, not --train-dir (the catalog and sessions come from "
            "the dataset). Received: --items=10",
        ),
        (
            ["--train-dir", "/d", "--valid-dir", "/v", "--sessions", "9000"],
            "--sessions is for synthetic sessions, not --train-dir",
        ),
        (
            ["--train-dir", "/d"],
            "--train-dir needs --valid-dir (held-out sessions for recall@10). "
            "Received: --train-dir='/d'",
        ),
        (["--valid-dir", "/v"], "--valid-dir needs --train-dir. Received: --valid-dir='/v'"),
        (
            ["--checkpoint-every", "5"],
            "--checkpoint-every needs --checkpoint-dir. Received: --checkpoint-every=5",
        ),
        (
            ["--checkpoint-dir", "/c", "--checkpoint-keep", "-1"],
            "--checkpoint-keep must be >= 0. Received: --checkpoint-keep=-1",
        ),
        (
            ["--train-dir", "/no/such/dir", "--valid-dir", "/v"],
            "error: --train-dir is not a directory. Received: --train-dir='/no/such/dir'",
        ),
    ],
)
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
    assert err[0] == (
        "error: --encoder transformer needs the transformers package (pip install "
        "transformers==4.33.3). Received: --encoder=transformer"
    )


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
    glued = [s for k in range(9) for p in per_rank for s in p[k * 500 : (k + 1) * 500]]
    assert glued == sessions(whole)
    # Zipf-like: the 10 most frequent items are a large share of all draws
    counts = np.sort(np.bincount(whole["values"]))[::-1]
    assert counts[:10].sum() / counts.sum() > 0.2


def test_bench_runs_the_sampled_row_on_the_sharded_table_unless_skipped():
    from merlin_models_de.apps.bench import next_item as bench

    def runs(*argv):
        return {r["name"]: r for r in bench._runs(bench._parser().parse_args(list(argv)))}

    every = runs("--np", "2")
    assert list(every) == list(bench.RUNS)
    sampled = every["sharded, sampled (global in-batch)"]
    assert sampled["ranks"] == 2
    assert sampled["args"] == every["sharded"]["args"] + ["--loss", "sampled"]
    assert list(runs("--skip", "sampled,single")) == ["data-parallel", "sharded"]


def test_bench_rows_give_speed_and_memory_ratios():
    from merlin_models_de.apps.bench.next_item import markdown, row

    def report(sps, rss, emb, kind):
        return {
            "warm_samples_per_second": sps,
            "total_embedding_bytes": 1000,
            "final_loss": 7.0,
            "item_table_kind": kind,
            "val": {"recall_at_10": 0.3, "ndcg_at_10": 0.2},
            "epochs": [{"embedding_bytes": emb, "peak_rss_bytes": rss}],
        }

    single = row("single", 1, report(100.0, [800], [1000], "DATA_PARALLEL"), {})
    dp = row(
        "data-parallel",
        2,
        report(110.0, [500, 400], [1000, 1000], "DATA_PARALLEL"),
        {"single": single},
    )
    sharded = row(
        "sharded",
        2,
        report(440.0, [100, 120], [500, 500], "ROW_WISE"),
        {"single": single, "data-parallel": dp},
    )
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
    return ColumnSchema(
        name,
        tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL],
        dtype=np.int64,
        is_list=is_list,
        is_ragged=is_list,
        properties=props,
    )


def test_the_item_column_is_the_one_item_id_list_column_and_its_domain_the_catalog(tmp_path):
    from merlin_models_de.apps.common.schemas import load_schema
    from merlin_models_de.apps.next_item.data import item_sequence_column

    def column(name, *cols):
        path = _schema_dir(tmp_path / name, cols)
        return item_sequence_column(load_schema(path), "--train-dir", path)

    assert column("ok", _item("items", 499), _item("user_id", is_list=False)) == ("items", 500)
    with pytest.raises(ValueError) as err:
        column("two", _item("a"), _item("b"))
    assert str(err.value) == (
        "--train-dir's schema must have exactly one item-id list column (tags ITEM and ID, a "
        "list); it has 2 such columns ['a', 'b']. Received: --train-dir="
        f"{str(tmp_path / 'two')!r}"
    )
    with pytest.raises(ValueError, match=r"it has none among its columns \['item'\]"):
        column("scalar", _item("item", is_list=False))
    with pytest.raises(ValueError) as err:
        column("no_domain", _item("item", domain=False))
    assert str(err.value).startswith(
        "The item column 'item' in --train-dir's schema has no "
        "integer domain max (the catalog is max + 1 rows)."
    )


def test_a_dataset_directory_with_a_schema_only_exits_2_naming_it(tmp_path, capsys):
    train = _schema_dir(tmp_path / "train", [_item("a")])
    code, err = _main(["--train-dir", train, "--valid-dir", train], capsys)
    assert code == 2 and err == [
        f"error: --train-dir holds no .parquet files (only its "
        f"schema?). Received: --train-dir={train!r}"
    ], err


def test_a_catalog_too_big_for_memory_exits_2_with_one_line(capsys):
    code, err = _main(["--items", str(10**12), "--dim", "64"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(
        "error: The item table (1,000,000,000,000 items x 64 with "
        "adam's slots, over 1 rank(s)) needs 715255.7 GiB per rank, "
        "more than the "
    ), err
    assert err[0].endswith("Received: --items=1000000000000"), err


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "two item columns",
            "error: --train-dir's schema must have exactly one item-id list "
            "column (tags ITEM and ID, a list); it has 2 such columns ['a', 'b']",
        ),
        (
            "valid without it",
            "error: --valid-dir's schema has no column 'a' (the item column of --train-dir)",
        ),
    ],
)
def test_schema_problems_exit_2_with_one_line_naming_the_column(tmp_path, capsys, case, message):
    train = [_item("a"), _item("b")] if case == "two item columns" else [_item("a")]
    valid = train if case == "two item columns" else [_item("b")]
    code, err = _main(
        [
            "--train-dir",
            _schema_dir(tmp_path / "train", train),
            "--valid-dir",
            _schema_dir(tmp_path / "valid", valid),
        ],
        capsys,
    )
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(message), err
