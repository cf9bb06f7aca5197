"""The DLRM bench (python -m merlin_models_de.apps.bench): its runs and step breakdown, its
rows' medians and paired ratios, the repeats run again while the hypervisor takes the CPU,
and where it writes its results."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from tests.commands.launch import QUIET_ENV as ENV


@pytest.mark.timeout(1500)  # 4 command runs + the breakdown: ~5 min beside another worker
@pytest.mark.parametrize(
    "skip",
    [
        # the one-process row, the sharded row and its breakdown (~3-7 min); CI's tier checks
        # the rows' arithmetic (test_bench_rows_take_the_median...) and the plots
        # (tests/unit/test_capacity.py), not the runs
        pytest.param(
            "data-parallel,local-tables,no-validation,no-ahead,no-merge", marks=pytest.mark.full
        ),
        pytest.param("", marks=pytest.mark.full),
    ],
)  # every baseline (~6 min)
def test_bench_runs_every_baseline_and_reports_ratios(tmp_path, skip):
    out = str(tmp_path / "bench")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "merlin_models_de.apps.bench",
            "--np",
            "2",
            "--rows",
            "2048",
            "--batch-size",
            "64",
            "--epochs",
            "2",
            "--max-table-rows",
            "1000",
            "--dim",
            "8",
            "--optimizers",
            "sgd",
            "--repeats",
            "1",
            "--breakdown-iterations",
            "5",
            "--skip",
            skip,
            "--out",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=1400,
        env=ENV,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    result = json.load(open(os.path.join(out, "bench.json"), encoding="utf-8"))
    rows = {r["run"]: r for r in result["rows"]}
    expected = {
        "single",
        "data-parallel",
        "bound/local-tables",
        "horovod/work_balanced",
        "horovod/work_balanced/no-validation",
        "horovod/work_balanced/no-ahead",
        "horovod/work_balanced/no-merge",
    }
    assert set(rows) == ({"single", "horovod/work_balanced"} if skip else expected)
    single, mp = rows["single"], rows["horovod/work_balanced"]
    assert mp["x_single"] == pytest.approx(
        mp["warm_samples_per_second"] / single["warm_samples_per_second"]
    )
    assert mp["embedding_fraction"] <= 0.55
    if not skip:
        dp = rows["data-parallel"]
        assert mp["x_data_parallel"] == pytest.approx(
            mp["warm_samples_per_second"] / dp["warm_samples_per_second"]
        )
        assert dp["embedding_fraction"] == pytest.approx(1.0)
    for row in rows.values():  # (the medians over repeats: test_bench_rows_take_the_median...)
        speeds = [r["warm_samples_per_second"] for r in row["repeats"]]
        assert len(speeds) == 1 and row["warm_steps"] == 16
        assert row["warm_samples_per_second"] == pytest.approx(statistics.median(speeds))
        steps = row["repeats"][0]["warm_step_seconds"]
        assert steps["steps"] == 16 and 0 < steps["min"] <= steps["median"] <= steps["max"]
        # the mean step is the warm speed's
        assert steps["mean"] == pytest.approx(128 / row["repeats"][0]["warm_samples_per_second"])
        assert row["steady_samples_per_second"] == pytest.approx(128 / row["warm_step_median"])
    parts = result["breakdown"]["sgd"]
    assert set(parts["parts"]) == {
        "compute",
        "ids_exchange",
        "vectors_forward",
        "merged_backward",
        "validation",
    }
    assert all(v >= 0 for v in parts["parts"].values()) and parts["other_waiting"] >= 0
    assert parts["step"] > 0 and parts["fit_step"] > 0
    assert parts["gap"] == pytest.approx(parts["step"] - sum(parts["parts"].values()))
    assert parts["reports"]["distributed"]["pieces"]["step"]["calls"] == 5
    fit = parts["fit"]
    assert fit["loader"] >= 0 and fit["fit_median"] == pytest.approx(
        rows["horovod/work_balanced"]["warm_step_median"]
    )
    assert fit["train_step"] + fit["loader"] + fit["rest"] + fit["epoch_starts"] == pytest.approx(
        fit["fit_step"]
    )
    table = open(os.path.join(out, "bench.md"), encoding="utf-8").read()
    assert all(f"| {name} |" in table for name in rows)
    assert "Step breakdown, horovod/work_balanced, sgd" in table
    assert "| rows backward and dense average (one all-to-all) |" in table


def test_bench_rows_take_the_median_of_their_repeats_and_keep_each():
    """The bench's row from 3 repeats (what --repeats 3 gives): speeds and times are the
    median, the spread is min-max, memory the largest, ratios are between medians."""
    from merlin_models_de.apps.bench.dlrm import _row, markdown

    def report(sps, step, rss, first):
        cpu = {"user": 3000 / sps, "system": 1000 / sps}  # a quarter in the kernel
        return {
            "warm_samples_per_second": sps,
            "first_epoch_samples_per_second": sps / 10,
            "warm_cpu_per_1000_samples": cpu,
            "warm_host_steal_share": sps / 10_000,
            "time_to_first_step": first,
            "global_batch": 128,
            "total_embedding_bytes": 200,
            "warm_step_seconds": {"median": step, "max": 2 * step},
            "epochs": [
                {"steps": 16},
                {
                    "steps": 16,
                    "peak_rss_bytes": rss,
                    "loss": 0.5,
                    "val_auc": 0.6,
                    "embedding_bytes": [100, 100],
                },
            ],
        }

    run = {"name": "horovod/x", "optimizer": "sgd", "ranks": 2}
    reps = [
        (report(300.0, 0.4, [5, 7], 9.0), 1.0),
        (report(100.0, 1.2, [6, 4], 7.0), 1.0),
        (report(200.0, 0.6, [3, 3], 8.0), 1.0),
    ]
    single = {
        "warm_samples_per_second": 400.0,
        "steady_samples_per_second": 256.0,
        "peak_rss_per_rank": [10],
        "time_to_first_step": 4.0,
    }
    row = _row(run, reps, single, None)
    assert [r["warm_samples_per_second"] for r in row["repeats"]] == [300.0, 100.0, 200.0]
    assert row["warm_samples_per_second"] == 200.0
    assert (row["warm_min"], row["warm_max"]) == (100.0, 300.0)
    assert row["warm_spread"] == pytest.approx(1.0)
    assert row["warm_step_median"] == 0.6 and row["slowest_step"] == 2.4
    assert row["steady_samples_per_second"] == pytest.approx(128 / 0.6)
    assert row["peak_rss_per_rank"] == [6, 7] and row["embedding_fraction"] == 0.5
    assert row["time_to_first_step"] == 8.0 and row["warm_steps"] == 16
    assert row["x_single"] == pytest.approx(0.5)
    assert row["steady_x_single"] == pytest.approx((128 / 0.6) / 256.0)
    assert row["rss_x_single"] == pytest.approx(0.7)
    assert "x_data_parallel" not in row
    # CPU seconds per 1,000 samples (every rank, user + kernel): the repeats' median
    assert row["cpu_per_1000_samples"] == pytest.approx(4000 / 200.0)
    assert row["cpu_system_share"] == pytest.approx(0.25)
    # the most CPU the hypervisor took during a repeat's warm epochs
    assert [r["host_steal_share"] for r in row["repeats"]] == [0.03, 0.01, 0.02]
    assert row["host_steal_share"] == 0.03
    assert "| 3.0% | 0.6000 |" in markdown([row])
    assert "paired_x_single" not in row  # the reference kept no repeats


def test_bench_pairs_each_repeat_with_the_reference_of_its_round():
    """Paired ratios follow the host's drift between rounds: each repeat over the reference's
    repeat of the same round (a round the reference lost is left out), then the median."""
    from merlin_models_de.apps.bench.dlrm import _paired_ratios, _row

    def rep(sps, round_):
        return {"warm_samples_per_second": sps, "round": round_}

    single = [rep(100.0, 0), rep(60.0, 1), rep(50.0, 2)]
    assert _paired_ratios([rep(80.0, 0), rep(45.0, 2)], single) == pytest.approx([0.8, 0.9])
    assert _paired_ratios([rep(80.0, 3)], single) == []
    assert _paired_ratios([rep(80.0, 0)], None) == []
    # without recorded rounds the position is the round
    assert _paired_ratios(
        [{"warm_samples_per_second": 30.0}], [{"warm_samples_per_second": 60.0}]
    ) == [0.5]

    def report(sps, round_):
        return {
            "warm_samples_per_second": sps,
            "first_epoch_samples_per_second": 1.0,
            "time_to_first_step": 1.0,
            "global_batch": 128,
            "total_embedding_bytes": 200,
            "warm_step_seconds": None,
            "bench_round": round_,
            "epochs": [
                {"steps": 16},
                {
                    "steps": 16,
                    "peak_rss_bytes": [1],
                    "loss": 0.5,
                    "val_auc": 0.6,
                    "embedding_bytes": [100],
                },
            ],
        }

    run = {"name": "horovod/x", "optimizer": "sgd", "ranks": 2}
    ref = _row(
        {**run, "name": "single", "ranks": 1},
        [(report(s, k), 1.0) for k, s in enumerate([300.0, 100.0, 400.0])],
        None,
        None,
    )
    row = _row(run, [(report(s, k), 1.0) for k, s in enumerate([300.0, 100.0, 200.0])], ref, None)
    assert row["x_single"] == pytest.approx(200 / 300)  # between medians
    assert row["paired_x_single"] == pytest.approx(1.0)  # median of 1.0, 1.0, 0.5


def test_bench_runs_a_repeat_again_while_the_hypervisor_took_too_much_cpu(monkeypatch, capsys):
    """A repeat whose host lost more than --max-steal of its CPU to the hypervisor runs again,
    at most --steal-retries times (the last attempt is kept); hosts that do not say pass."""
    from merlin_models_de.apps.bench import dlrm as bench

    shares = {"a": [0.2, 0.01], "b": [0.3, 0.2, 0.4], "c": [None]}
    launched = []

    def finished(module, runs, args, report_name, label, failed):
        (run,) = runs
        launched.append(run["name"])
        yield run, {"warm_host_steal_share": shares[run["name"]].pop(0)}, 1.0

    monkeypatch.setattr(bench, "finished_runs", finished)
    args = bench._parser().parse_args(["--max-steal", "0.05", "--steal-retries", "2"])
    kept = [
        (run["name"], rep["warm_host_steal_share"])
        for run, rep, _ in bench.unstolen_runs(
            "m", [{"name": n} for n in "abc"], args, None, None, []
        )
    ]
    assert kept == [("a", 0.01), ("b", 0.4), ("c", None)]
    assert launched == ["a", "a", "b", "b", "b", "c"]
    assert capsys.readouterr().out.count("run again") == 3
    assert bench.main(["--max-steal", "1.5"]) == 2
    assert "--max-steal=1.5" in capsys.readouterr().err


@pytest.mark.parametrize("bench", ["dlrm", "next_item", "capacity"])
def test_a_bench_writes_outside_the_published_results_unless_told(bench):
    """By default under runs/ (git-ignored), so a trial run never rewrites bench/ (the results
    docs/benchmarks.md quotes); --out bench/... updates those."""
    import importlib

    parser = importlib.import_module(f"merlin_models_de.apps.bench.{bench}")._parser()
    default = parser.parse_args([]).out
    assert default == os.path.join("runs", "bench")
    assert parser.parse_args(["--out", "bench"]).out == "bench"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", os.path.join(default, "bench.json")], cwd=root, check=False
    )
    if ignored.returncode == 128:  # not a git checkout (an unpacked sdist)
        pytest.skip("no git checkout to ask")
    assert ignored.returncode == 0
