"""The capacity search (python -m merlin_models_de.apps.bench.capacity), the planner's memory
model it checks, and the bench's plots (its real runs: tests/commands/test_capacity.py)."""

import json
from pathlib import Path

import pytest

from merlin_models_de.apps.bench import capacity
from merlin_models_de.apps.bench.plots import bench_png, capacity_png
from merlin_models_de.apps.common.schemas import synthetic_schema
from merlin_models_de.apps.common.synthetic import capped_schema
from merlin_models_de.planner import plan
from merlin_models_de.planner.memory import (
    ALLOCATOR_OVERHEAD,
    DENSE_GRADIENT_COPIES,
    DRAWN_WHOLE_KEPT,
    RUNTIME_BYTES,
    plan_peak_bytes,
    rank_peak_bytes,
    replicated_peak_bytes,
)
from merlin_models_de.tables import FeatureSpec, TableSpec, tables_from_schema

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def tables(*rows, dim=4):
    return [
        TableSpec(f"t{i}", r, dim, (FeatureSpec(f"t{i}", f"t{i}"),)) for i, r in enumerate(rows)
    ]


def test_a_ranks_peak_is_runtime_and_tables_with_slots_and_dense_gradients_if_allreduced():
    bare = dict(runtime=0, overhead=0)  # the bytes themselves
    assert rank_peak_bytes(1000, "sgd", **bare) == 1000 * 4
    assert rank_peak_bytes(1000, "adagrad", **bare) == 2 * 1000 * 4
    assert rank_peak_bytes(1000, "adam", dtype_bytes=2, runtime=7, overhead=0) == 7 + 3 * 1000 * 2
    assert rank_peak_bytes(1000, "adagrad", dense_gradients=True, **bare) == (
        (2 + DENSE_GRADIENT_COPIES) * 1000 * 4
    )
    # every large allocation is resident a little above its bytes (the allocator's share)
    assert rank_peak_bytes(1000, "adagrad", runtime=0) == int(
        2 * 1000 * 4 * (1 + ALLOCATOR_OVERHEAD)
    )
    assert rank_peak_bytes(1000, "adagrad") == RUNTIME_BYTES + rank_peak_bytes(
        1000, "adagrad", runtime=0
    )
    # mm.Embeddings: one process, and each rank of Merlin's data parallel (dense gradients);
    # both draw every table whole, and keep part of the largest draw
    kept = DRAWN_WHOLE_KEPT * 100 * 4 * 4
    assert replicated_peak_bytes(tables(100, 100, 100), "adagrad", runtime=0) == int(
        (1 + ALLOCATOR_OVERHEAD) * 2 * 300 * 4 * 4 + kept
    )
    assert replicated_peak_bytes(tables(100, 100, 100), "sgd", 2, runtime=0) == int(
        (1 + ALLOCATOR_OVERHEAD) * 300 * 4 * 4 + DENSE_GRADIENT_COPIES * 300 * 4 * 4 + kept
    )


def test_a_table_drawn_whole_can_set_the_peak_while_initializing():
    bare = dict(runtime=0, overhead=0)
    # three copies of the table being drawn, on top of those made: above SGD's one copy
    assert rank_peak_bytes(1000, "sgd", drawn_whole=600, **bare) == (1000 + 2 * 600) * 4
    # after the draw: the tables, their slots and what the allocator kept of the draw
    assert rank_peak_bytes(1000, "adagrad", drawn_whole=400, **bare) == int(
        (2 * 1000 + DRAWN_WHOLE_KEPT * 400) * 4
    )
    assert replicated_peak_bytes(tables(100, 10), "sgd", runtime=0) == int(
        (1 + ALLOCATOR_OVERHEAD) * 110 * 4 * 4 + 2 * 100 * 4 * 4
    )
    # one process draws its tables whole; several ranks draw large shards by blocks of rows
    one = plan(tables(100, 10), 1)
    assert plan_peak_bytes(one, "sgd", runtime=0) == [
        replicated_peak_bytes(tables(100, 10), "sgd", runtime=0)
    ]
    two = plan(tables(100, 10), 2, strategy="memory_balanced")
    assert plan_peak_bytes(two, "sgd", runtime=0) == [
        int((1 + ALLOCATOR_OVERHEAD) * two.rank_elements(r) * 4) for r in range(2)
    ]


def test_a_plans_peaks_follow_its_shards():
    p = plan(tables(100, 50, 30), 2, strategy="memory_balanced")
    assert plan_peak_bytes(p, "sgd", runtime=0, overhead=0) == [
        p.rank_elements(r) * 4 for r in range(2)
    ]
    assert plan_peak_bytes(p, "adagrad") == [
        RUNTIME_BYTES + int((1 + ALLOCATOR_OVERHEAD) * 2 * p.rank_elements(r) * 4) for r in range(2)
    ]


def test_the_model_predicts_the_published_capacity_runs():
    """Every rank of every run of the published capacity searches that trained: predicted
    within 5% (data parallel: its busiest rank; its other rank, holding the same, peaked
    up to 21% lower: where the allocator's pool of the dense gradients lands varies)."""
    checked = 0
    for name in ("capacity", "capacity-16-bit", "capacity-4-ranks"):
        published = json.loads((ROOT / "bench" / f"{name}.json").read_text())
        keys = ("dim", "optimizer", "strategy", "batch_size")
        options = {k: published["config"][k] for k in keys}
        args = type("Args", (), options)
        for row in published["rows"]:
            (config,) = capacity.configurations(row["config"], 2, options["optimizer"])
            for run in row["runs"]:
                if not run["ok"]:
                    continue
                predicted = capacity.predicted_peaks(config, run["scale"], args)
                measured = run["rank_peaks"]
                if config["embeddings"] == "merlin":
                    predicted, measured = [max(predicted)], [max(measured)]
                for p, m in zip(predicted, measured):
                    assert abs(p - m) <= 0.05 * m, (name, row["config"], run["scale"], p, m)
                    checked += 1
    assert checked >= 30, checked


def test_configurations_and_their_errors():
    got = capacity.configurations("single,data-parallel,sharded,sharded-4", 2)
    assert [(c["name"], c["ranks"], c["embeddings"]) for c in got] == [
        ("single", 1, "merlin"),
        ("data-parallel", 2, "merlin"),
        ("sharded", 2, "distributed"),
        ("sharded-4", 4, "distributed"),
    ]
    with pytest.raises(ValueError, match=r"Received: --configs='single,sharded-x'"):
        capacity.configurations("single,sharded-x", 2)
    (compact,) = capacity.configurations("sharded:rowwise_adagrad:bfloat16", 2, "adagrad")
    assert (compact["ranks"], compact["optimizer"], compact["table_dtype"]) == (
        2,
        "rowwise_adagrad",
        "bfloat16",
    )
    assert capacity.configurations("single", 2, "sgd")[0]["optimizer"] == "sgd"
    with pytest.raises(ValueError, match=r"'int8' is neither an optimizer"):
        capacity.configurations("sharded:int8", 2)


def test_16_bit_tables_halve_the_table_and_keep_float32_state():
    # row-wise Adagrad: 1000 elements in 250 rows: 2 bytes each, a float32 per row
    bare = dict(runtime=0, overhead=0)
    assert rank_peak_bytes(1000, "rowwise_adagrad", rows=250, table_bytes=2, **bare) == (
        1000 * 2 + 250 * 4
    )
    # initialization draws in float32: a table drawn whole adds two float32 copies
    assert rank_peak_bytes(1000, "sgd", drawn_whole=600, table_bytes=2, **bare) == (
        1000 * 2 + 2 * 600 * 4
    )
    # replicated tables keep the block's dtype
    p = plan(tables(100, 10), 2, strategy="memory_balanced", data_parallel_threshold=10 * 16)
    narrow = plan_peak_bytes(p, "sgd", table_bytes=2, **bare)
    assert narrow == [
        sum(s.elements * (4 if s.kind.value == "data_parallel" else 2) for s in p.shards_on(r))
        for r in range(2)
    ]


def test_a_bad_budget_exits_2_naming_its_option(tmp_path, capsys):
    assert capacity.main(["--budget", "lots", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --budget must look like '80GB' or '16GiB'. Received: --budget='lots'"
    )


def _tried(scale, ok, peak_gib):
    return {
        "scale": scale,
        "ok": ok,
        "why": None if ok else "over budget",
        "seconds": 1.0,
        "host_peak": int(peak_gib * 2**30),
        "rank_peaks": [int(peak_gib * 2**30)] if ok else None,
        "embedding_bytes": [2**30] if ok else None,
        "predicted": [int(1.1 * peak_gib * 2**30)],
    }


def test_the_summary_row_is_the_largest_scale_that_trained_and_the_plot_is_a_png(tmp_path):
    config = {"name": "single", "ranks": 1, "embeddings": "merlin"}
    row = capacity.summary_rows(
        config, [_tried(1, True, 2), _tried(2, True, 3), _tried(4, False, 9), _tried(3, False, 8)]
    )
    assert row["largest_scale"] == 2 and row["first_failed_scale"] == 3
    assert row["measured_peak_per_rank"] == 3 * 2**30
    assert row["prediction_error"] == pytest.approx(0.1)
    table = capacity.markdown([row])
    assert "| single | 1 | 2 (3) | 1.00 | 3.00 | 3.30 | +10.0% | 3.00 |" in table
    assert capacity_png([row], str(tmp_path / "c.png")) == f"Plot: {tmp_path / 'c.png'}"
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
    bench_rows = [
        {
            "run": "single",
            "optimizer": "sgd",
            "ranks": 1,
            "warm_samples_per_second": 1000.0,
            "peak_rss_per_rank": [2**30],
        },
        {
            "run": "horovod/memory_optimized",
            "optimizer": "sgd",
            "ranks": 2,
            "warm_samples_per_second": 600.0,
            "peak_rss_per_rank": [2**29, 2**29],
        },
    ]
    assert bench_png(bench_rows, str(tmp_path / "b.png"), [row]).startswith("Plot:")
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG


def test_predict_again_rewrites_the_predictions_and_keeps_the_measurements(tmp_path):
    runs = [_tried(0.001, True, 1.0), _tried(0.002, False, 9.0)]
    saved = {
        "config": {
            "dim": 16,
            "optimizer": "sgd",
            "strategy": "memory_optimized",
            "budget": "3GiB",
            "np": 2,
        },
        "rows": [{"config": "sharded", "ranks": 2, "embeddings": "distributed", "runs": runs}],
    }
    (tmp_path / "capacity.json").write_text(json.dumps(saved))
    assert capacity.main(["--out", str(tmp_path), "--predict-again"]) == 0
    again = json.loads((tmp_path / "capacity.json").read_text())
    assert again["config"]["budget"] == "3GiB" and again["config"]["optimizer"] == "sgd"
    (row,) = again["rows"]
    criteo = tables_from_schema(capped_schema(synthetic_schema("criteo"), None, 0.001), dim=16)
    want = plan_peak_bytes(plan(criteo, 2, strategy="memory_optimized"), "sgd")
    assert row["runs"][0]["predicted"] == want
    assert row["runs"][0]["rank_peaks"] == runs[0]["rank_peaks"]  # measurements unchanged
    assert row["largest_scale"] == 0.001 and row["first_failed_scale"] == 0.002
    assert (tmp_path / "capacity.png").read_bytes()[:8] == PNG
    assert "| sharded | 2 | 0.001 (0.002) |" in (tmp_path / "capacity.md").read_text()


def test_a_dynamic_configuration_plans_a_key_map_beside_each_ranks_share():
    """``sharded:dynamic``: the --dynamic tables (C1, C10 by default) at their scaled
    cardinality, sliced by rows over the ranks; each rank's predicted peak is the memory
    model's plus 56 bytes a row of its shares, and the DLRM command is told --dynamic."""
    from merlin_models_de.planner.types import KEY_MAP_BYTES_PER_ROW
    from merlin_models_de.tables import DynamicTable

    fixed, dynamic = capacity.configurations("sharded,sharded:sgd:dynamic", 2)
    assert (fixed["dynamic"], dynamic["dynamic"], dynamic["optimizer"]) == (False, True, "sgd")
    for name in ("single:dynamic", "data-parallel:dynamic"):
        with pytest.raises(ValueError, match=rf"'{name}': only a sharded configuration"):
            capacity.configurations(name, 2)
    args = capacity._parser().parse_args([])
    assert args.dynamic == "C1,C10"
    scale = 0.01  # C1 and C10: 100,000 rows each
    schema = capped_schema(synthetic_schema("criteo"), None, scale)
    options = {name: DynamicTable(capacity=100_000) for name in ("C1", "C10")}
    placement = plan(
        tables_from_schema(schema, dim=args.dim, dynamic=options), 2, strategy=args.strategy
    )
    for rank in range(2):  # each rank owns half of each table's keys
        shares = {s.table: s.rows for s in placement.shards_on(rank) if s.table in options}
        assert shares == {"C1": 50_000, "C10": 50_000}
    assert [placement.key_map_bytes(r) for r in range(2)] == [KEY_MAP_BYTES_PER_ROW * 100_000] * 2
    assert capacity.predicted_peaks(dynamic, scale, args) == plan_peak_bytes(placement, "sgd")
    report = "/tmp/report.json"
    cmd = capacity.command(dynamic, scale, args, report)
    assert cmd[cmd.index("--dynamic") :][:4] == ["--dynamic", "C1", "--dynamic", "C10"]
    assert "--dynamic" not in capacity.command(fixed, scale, args, report)
    args.dynamic = "C1,C99"
    with pytest.raises(ValueError, match=r"--dynamic names 'C99', which is not a table"):
        capacity.predicted_peaks(dynamic, scale, args)


def test_a_dynamic_feature_not_in_the_schema_exits_2_before_any_run(tmp_path, capsys):
    argv = ["--configs", "sharded:dynamic", "--dynamic", "C99", "--out", str(tmp_path)]
    assert capacity.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --dynamic names 'C99', which is not a table of the schema")
    assert err.endswith("Received: --dynamic='C99'")
    assert not list(tmp_path.iterdir())  # nothing ran
