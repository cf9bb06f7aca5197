"""The capacity search's real runs of the DLRM command: a run over its budget stopped on every
rank, one within it measured (the search itself: tests/unit/test_capacity.py)."""

import json

import psutil
import pytest

from merlin_models_de.apps.bench import capacity
from merlin_models_de.apps.common.schemas import synthetic_schema
from merlin_models_de.apps.common.synthetic import capped_schema
from merlin_models_de.planner.memory import replicated_peak_bytes
from merlin_models_de.tables import tables_from_schema


def _started_since(before):
    """Command lines of the processes started since ``before`` (pids) that are still alive."""
    lines = []
    for p in psutil.process_iter():
        try:
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE:
                lines.append(" ".join(p.cmdline()))
        except psutil.Error:  # gone meanwhile
            pass
    return lines


@pytest.mark.full  # two real runs of the DLRM command (~1.5 min)
def test_a_run_over_budget_is_stopped_with_every_rank_and_one_within_it_reports(tmp_path):
    """Real runs of the DLRM command: 2 ranks under a 1 GiB budget are stopped (both ranks
    and horovodrun gone); one process at a small scale trains its 20 steps and its measured
    peak is the report's, the prediction beside it."""
    args = capacity._parser().parse_args(
        ["--out", str(tmp_path), "--steps", "4", "--batch-size", "64", "--budget", "1GiB"]
    )
    args.budget_bytes = 2**30
    sharded = capacity.configurations("sharded", 2)[0]
    before = {p.pid for p in psutil.process_iter()}
    over = capacity.run_once(sharded, 0.001, args, str(tmp_path / "over.json"))
    assert not over["ok"] and over["why"].startswith("over budget")
    assert over["host_peak"] > 2**30 and over["rank_peaks"] is None
    assert not [p for p in _started_since(before) if "merlin_models_de.apps.dlrm" in p]

    args.budget_bytes = 8 * 2**30
    single = capacity.configurations("single", 2)[0]
    done = capacity.run_once(single, 0.001, args, str(tmp_path / "one.json"))
    assert done["ok"], done["why"]
    report = json.load(open(tmp_path / "one.json", encoding="utf-8"))
    assert done["rank_peaks"] == report["epochs"][-1]["peak_rss_bytes"]
    assert report["world_size"] == 1 and report["epochs"][-1]["steps"] == 4
    assert done["rank_peaks"][0] > 2**29  # TensorFlow and Merlin alone take more
    criteo = tables_from_schema(capped_schema(synthetic_schema("criteo"), None, 0.001), dim=16)
    assert capacity.predicted_peaks(single, 0.001, args) == [
        replicated_peak_bytes(criteo, "adagrad")
    ]


@pytest.mark.full  # a real 2-rank run of the DLRM command (~30 s)
def test_a_dynamic_configuration_trains_its_dynamic_tables_and_is_predicted(tmp_path):
    """``sharded:dynamic`` runs the DLRM command with --dynamic C1 --dynamic C10: the report
    says both tables took keys (none evicted: capacity is the scaled cardinality), and each
    rank's measured peak is within 10% of the prediction with its key maps."""
    args = capacity._parser().parse_args(
        ["--out", str(tmp_path), "--steps", "4", "--batch-size", "64", "--budget", "8GiB"]
    )
    args.budget_bytes = 8 * 2**30
    (dynamic,) = capacity.configurations("sharded:dynamic", 2)
    done = capacity.run_once(dynamic, 0.01, args, str(tmp_path / "dynamic.json"))
    assert done["ok"], done["why"]
    report = json.load(open(tmp_path / "dynamic.json", encoding="utf-8"))
    held = report["epochs"][-1]["dynamic_tables"]
    assert sorted(held) == ["C1", "C10"]
    assert all(t["keys"] > 0 and t["evicted"] == 0 for t in held.values()), held
    predicted = capacity.predicted_peaks(dynamic, 0.01, args)
    for p, m in zip(predicted, done["rank_peaks"]):
        assert abs(p - m) <= 0.1 * m, (predicted, done["rank_peaks"])
