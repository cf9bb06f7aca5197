"""The training commands refuse parquet whose schema shows NVTabular 23.08's CPU hashing
(``HashBucket``, ``Categorify(num_buckets=...)``: the row's index is hashed too) and accept
the value-only operators of serving/hashing.py (docs/nvtabular.md, "Hashing"). Real
workflows fitted and applied on 48 rows; the commands stop before training."""

import argparse

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("nvtabular")

import nvtabular as nvt  # noqa: E402
from merlin.schema import Tags  # noqa: E402
from nvtabular import ops  # noqa: E402

from merlin_models_de.apps.common import row_hashing  # noqa: E402
from merlin_models_de.apps.common.schemas import load_schema  # noqa: E402
from merlin_models_de.apps.dlrm.__main__ import main as dlrm_main  # noqa: E402
from merlin_models_de.apps.next_item.__main__ import main as next_item_main  # noqa: E402
from merlin_models_de.serving.hashing import ValueCategorify, ValueHashBucket  # noqa: E402

ROWS = 48


def raw_rows():
    i = np.arange(ROWS)
    return pd.DataFrame(
        {
            "session_id": i % 8,
            "timestamp": i,
            "user_id": [f"u-{v}" for v in i % 7],
            "item_id": [f"i-{v}" for v in i % 13],
            "category": [f"c-{v}" for v in i % 11],
            "device": [f"d-{v}" for v in i % 3],
            "click": (i % 2).astype(np.int64),
        }
    )


def write(nodes, directory):
    """Fits ``nodes`` on the raw rows and writes the parquet and schema.pbtxt there."""
    workflow = nvt.Workflow(nodes)
    data = nvt.Dataset(raw_rows(), cpu=True)
    workflow.fit(data)
    workflow.transform(data).to_parquet(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """NVTabular's two hashings beside ours and a plain Categorify: (data dir, ours only)."""
    tmp = tmp_path_factory.mktemp("clicks")
    vocabularies = str(tmp / "categories")
    label = ["click"] >> ops.AddMetadata(tags=[Tags.BINARY_CLASSIFICATION, Tags.TARGET])
    theirs = (
        (["user_id"] >> ops.HashBucket(20) >> ops.TagAsUserID())
        + (["category"] >> ops.Categorify(out_path=vocabularies, max_size=10, num_buckets=4))
        + (["device"] >> ops.Categorify(out_path=vocabularies))
    )
    ours = (
        (["user_id"] >> ValueHashBucket(20) >> ops.TagAsUserID())
        + (["category"] >> ValueCategorify(out_path=vocabularies, max_size=10, num_buckets=4))
        + (["device"] >> ops.Categorify(out_path=vocabularies))
    )
    return write(theirs + label, tmp / "theirs"), write(ours + label, tmp / "ours")


def test_the_dlrm_command_refuses_nvtabular_hashing_naming_columns_and_fix(clicks, capsys):
    theirs, _ = clicks
    assert dlrm_main(["--train-dir", theirs, "--valid-dir", theirs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (
        "--train-dir has columns NVTabular hashed on CPU with the row's index: 'category' "
        "(Categorify(num_buckets=4)), 'user_id' (HashBucket(20));" in err[0]
    ), err
    assert (
        "ValueCategorify instead of Categorify and ValueHashBucket instead of HashBucket"
        in (err[0])
    )
    assert f"--hashed-on-gpu). Received: --train-dir={theirs!r}" in err[0]


def test_value_only_operators_and_gpu_data_are_accepted(clicks):
    theirs, ours = clicks
    assert row_hashing.row_hashed_columns(load_schema(ours)) == []
    args = argparse.Namespace(train_dir=theirs, valid_dir=None, hashed_on_gpu=True)
    assert row_hashing.row_hashing_problem(args) is None
    args = argparse.Namespace(train_dir=ours, valid_dir=theirs, hashed_on_gpu=False)
    assert "--valid-dir has columns" in row_hashing.row_hashing_problem(args)


def test_the_next_item_command_refuses_a_hashed_item_list(tmp_path, capsys):
    """The mark survives Groupby and ListSlice; only the item list the command trains is
    checked (the hashed user column beside it is not its input)."""
    hashed = ops.Categorify(out_path=str(tmp_path / "categories"), max_size=10, num_buckets=4)
    item = ["item_id"] >> hashed >> ops.TagAsItemID()
    user = ["user_id"] >> ops.HashBucket(20)
    sessions = (["session_id", "timestamp"] + item + user) >> ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list"], "user_id": ["first"]},
    )
    items = sessions["item_id_list"] >> ops.ListSlice(-4) >> ops.AddMetadata(tags=[Tags.SEQUENCE])
    data = write(items + sessions["user_id_first"], tmp_path / "sessions")
    assert next_item_main(["--train-dir", data, "--valid-dir", data, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'item_id_list' (Categorify(num_buckets=4))" in err[0], err
    assert "user_id" not in err[0] and "ValueCategorify instead of Categorify" in err[0]
