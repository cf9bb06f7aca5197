"""The bench's plots (apps/bench/plots.py): a PNG of the bench rows, with the capacity curve
beside them when a capacity search ran, and the line that says where it went."""

import pytest

from merlin_models_de.apps.bench.plots import bench_png, capacity_png

pytest.importorskip("matplotlib")

ROWS = [
    {"run": "merlin", "optimizer": "adagrad", "ranks": 1, "warm_samples_per_second": 900.0,
     "peak_rss_per_rank": [2**30]},
    {"run": "sharded", "optimizer": "adagrad", "ranks": 2, "warm_samples_per_second": 1500.0,
     "peak_rss_per_rank": [2**29, 3 * 2**28]},
]  # fmt: skip
CAPACITY = [
    {"config": "2 ranks", "runs": [
        {"scale": 1, "ok": True, "rank_peaks": [2**30], "predicted": [2**30]},
        {"scale": 2, "ok": True, "rank_peaks": [2**31], "predicted": [2**31]},
        {"scale": 4, "ok": False},
    ]},
]  # fmt: skip


def _png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_and_capacity_plots_are_pngs(tmp_path):
    alone, beside = tmp_path / "bench.png", tmp_path / "bench_capacity.png"
    assert bench_png(ROWS, str(alone)) == f"Plot: {alone}" and _png(alone)
    assert bench_png(ROWS, str(beside), CAPACITY) == f"Plot: {beside}" and _png(beside)
    assert beside.stat().st_size > alone.stat().st_size  # a third panel
    curve = tmp_path / "capacity.png"
    assert capacity_png(CAPACITY, str(curve)) == f"Plot: {curve}" and _png(curve)
