"""The next-item command's dynamic tables (``--dynamic``, merlin_models_de/apps/next_item/):
a run with the category sequence dynamic counts its keys each epoch; the item column, whose
table the output is tied to, is refused naming the option and its value, on every rank."""

import json

import numpy as np
import pytest

from merlin_models_de.apps.common.synthetic import rank_rows
from merlin_models_de.apps.next_item.__main__ import (
    check_options,
    dynamic_feature_problem,
    parser,
)
from merlin_models_de.apps.next_item.data import categories_of, make_sessions
from tests.commands.test_next_item import TINY as NEXT_ITEM_TINY
from tests.commands.test_next_item import _run

# the next-item command's tiny run, in batches of 128 (a later option wins)
TINY = [*NEXT_ITEM_TINY, "--batch-size", "128"]


@pytest.mark.full  # a next-item run (~25 s); the option checks below run in the CI tier
def test_a_dynamic_category_table_counts_its_keys_each_epoch(tmp_path):
    path = str(tmp_path / "r.json")
    argv = [*TINY, "--epochs", "2", "--categories", "500", "--report", path]
    run = _run([*argv, "--dynamic", "category", "--evict", "lru"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.load(open(path, encoding="utf-8"))
    first, second = (e["dynamic_tables"] for e in report["epochs"])
    # every category of the training inputs got a row (capacity: the 500 rows), no more;
    # the inputs are the sessions less their last item (the target)
    sessions = make_sessions(2000, 20, rank_rows(1024, 128, 1, 0), seed=0)
    inputs = np.delete(sessions["values"], np.cumsum(sessions["lengths"]) - 1)
    seen = len(np.unique(categories_of(inputs, 500)))
    assert first["category"] == {"keys": seen, "admitted": seen, "evicted": 0}
    assert second["category"] == first["category"]  # epoch 2 brings no new key
    assert f"category: {seen:,} keys ({seen:,} admitted, 0 evicted)" in run.stdout
    assert 0.0 <= report["val"]["recall_at_10"] <= 1.0
    assert report["item_table_kind"] == "TABLE_WISE"


@pytest.mark.full  # 2 ranks: each owner holds its share of the keys
def test_two_ranks_hold_the_same_keys_as_one_process(tmp_path):
    """The sessions are the same set on any number of ranks, so the category keys that got a
    row are the same (1,000 rows: no share of 500 fills)."""
    path = str(tmp_path / "r.json")
    argv = [*TINY, "--batch-size", "64", "--epochs", "1", "--categories", "500"]
    run = _run([*argv, "--dynamic", "category=1000", "--report", path], ranks=2, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.load(open(path, encoding="utf-8"))
    sessions = make_sessions(2000, 20, [(0, 1024)], seed=0)
    inputs = np.delete(sessions["values"], np.cumsum(sessions["lengths"]) - 1)
    seen = len(np.unique(categories_of(inputs, 500)))
    (epoch,) = report["epochs"]
    assert epoch["dynamic_tables"]["category"] == {"keys": seen, "admitted": seen, "evicted": 0}
    assert report["world_size"] == 2


@pytest.mark.full  # 2 ranks: every rank exits 2 before TensorFlow loads
def test_two_ranks_refuse_a_dynamic_item_table_together():
    run = _run([*TINY, "--epochs", "1", "--dynamic", "item_id=500"], ranks=2, timeout=120)
    assert run.returncode != 0
    assert "Received: --dynamic item_id=500" in run.stdout + run.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--dynamic", "item_id=500"],
            "--dynamic cannot take the item column 'item_id': the output (softmax) is tied "
            "to its table",
        ),
        (["--loss", "sampled", "--dynamic", "item_id"], "the output (sampled) is tied"),
        (["--dynamic", "category"], "--dynamic names no feature of the model"),
        (["--categories", "1"], "Received: --categories=1"),
        (["--dynamic", "category", "--embeddings", "merlin"], "--dynamic needs --embeddings"),
    ],
)
def test_bad_dynamic_options_are_named(argv, message):
    args = parser().parse_args([*TINY, *argv])
    problem = check_options(args)
    if problem is None:  # the item column is known once the dataset is read
        args.item_column = "item_id"
        problem = dynamic_feature_problem(args)
    assert problem is not None and message in problem


def test_the_category_feature_takes_dynamic_options():
    args = parser().parse_args([*TINY, "--categories", "50", "--dynamic", "category=40"])
    assert check_options(args) is None
    args.item_column = "item_id"
    assert dynamic_feature_problem(args) is None
