"""The arrivals bench (merlin_models_de/apps/bench/arrivals.py) run tiny as a subprocess: its
report's fields, and the hit shares its construction fixes: on the first validation day a
dynamic table of the fixed table's rows holds exactly day 1's ids (the same hits), later it
holds ids the frozen vocabulary sends to the out-of-vocabulary row (more hits); no side hits an
id never seen. Its options' errors are checked in this process."""

import json
import subprocess
import sys

import numpy as np
import pytest

from merlin_models_de.apps.bench.arrivals import (
    auc,
    check_options,
    click_log,
    cohort_shares,
    frozen_rows,
    parser,
)
from tests.commands.launch import HOROVODRUN
from tests.commands.launch import QUIET_ENV as ENV

TINY = [
    "--days",
    "3",
    "--clicks",
    "2048",
    "--users",
    "300",
    "--new-users",
    "60",
    "--items",
    "400",
    "--new-items",
    "100",
    "--global-batch-size",
    "256",
    "--dim",
    "8",
]


def _run(args, ranks=1, timeout=300):
    cmd = [sys.executable, "-m", "merlin_models_de.apps.bench", "arrivals", *args]
    if ranks > 1:
        cmd = [HOROVODRUN, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}"]
        cmd += ["--network-interface", "lo", sys.executable, "-m"]
        cmd += ["merlin_models_de.apps.bench.arrivals", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=ENV, check=False
    )


def check_report(report, ranks, policies):
    """The fields and hit shares of a TINY run's report."""
    assert report["world_size"] == ranks
    sides = ["fixed"] + [f"dynamic/{p}" for p in policies]
    assert list(report["sides"]) == sides and list(report["mean"]) == sides
    day1 = click_log(parser().parse_args(TINY), 1)
    vocab = {name: len(np.unique(day1[name])) for name in ("user_id", "item_id")}
    assert report["vocabulary"] == vocab
    for side in sides:
        entries = report["sides"][side]
        assert [e["day"] for e in entries] == [2, 3]
        for e in entries:
            assert 0 < e["auc"] < 1 and 0 < e["auc_outside_vocabulary"] < 1
            assert 0 < e["never_seen_share"] < 1 and 0 < e["outside_vocabulary_rows"] < 1
            # an id never seen can have no trained row, on any side
            assert 0 < e["hit_share"] <= 1 - e["never_seen_share"]
            assert set(e["hit_share_by_feature"]) == {"user_id", "item_id"}
    fixed = report["sides"]["fixed"]
    for policy in policies:
        dynamic = report["sides"][f"dynamic/{policy}"]
        counters = dynamic[0]["dynamic_tables"]
        if ranks == 1:  # day 1's ids fill the fixed table's rows less one, and no more
            assert {t: c["keys"] for t, c in counters.items()} == vocab
            assert all(c["evicted"] == 0 for c in counters.values())
            assert dynamic[0]["hit_share"] == fixed[0]["hit_share"]
        assert dynamic[1]["hit_share"] > fixed[1]["hit_share"]
        assert (
            report["mean"][f"dynamic/{policy}"]["hit_share"] > report["mean"]["fixed"]["hit_share"]
        )


def test_one_process_reports_auc_and_hits_per_day(tmp_path):
    path = str(tmp_path / "r.json")
    run = _run([*TINY, "--evict", "lfu", "--report", path])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| day | rows with an id outside day 1 |" in run.stdout
    assert "dynamic/lfu day 3: auc=" in run.stdout
    check_report(json.load(open(path, encoding="utf-8")), 1, ["lfu"])


@pytest.mark.full  # 2 ranks: each owner's share of the keys (the one-process run above)
def test_two_ranks_report_auc_and_hits_per_day(tmp_path):
    path = str(tmp_path / "r.json")
    run = _run([*TINY, "--evict", "lfu,lru", "--report", path], ranks=2, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check_report(json.load(open(path, encoding="utf-8")), 2, ["lfu", "lru"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--days", "1"], "--days must be >= 2. Received: --days=1"),
        (["--decay", "1.5"], "--decay must be in (0, 1). Received: --decay=1.5"),
        (
            ["--new-item-share", "0.5", "--decay", "0.6"],
            "Received: --new-item-share=0.5 --decay=0.6",
        ),
        (["--evict", "lfu,often"], "Received: --evict=lfu,often"),
        (["--clicks", "100"], "--clicks must hold one global batch (512). Received: --clicks=100"),
        (["--global-batch-size", "0"], "Received: --global-batch-size=0"),
    ],
)
def test_bad_options_are_named(argv, message):
    assert message in check_options(parser().parse_args(argv))


def test_the_log_brings_new_ids_each_day():
    """A cohort's share falls by --decay a day; ids of later days fall outside day 1's
    vocabulary, which sends them to row 0."""
    assert cohort_shares(4, 0.2, 0.5).tolist() == pytest.approx([0.625, 0.025, 0.05, 0.1, 0.2])
    args = parser().parse_args(TINY)
    day1, day3 = click_log(args, 1), click_log(args, 3)
    vocabulary = np.unique(day1["item_id"])
    assert (frozen_rows(day1["item_id"], vocabulary) > 0).all()
    outside = frozen_rows(day3["item_id"], vocabulary) == 0
    assert 0.2 < outside.mean() < 0.6  # days 2 and 3's items: 0.2 + 0.12, and their tails
    np.testing.assert_array_equal(click_log(args, 3)["item_id"], day3["item_id"])
    assert auc(np.array([1, 0, 1]), np.array([0.2, 0.2, 0.2])) == 0.5
