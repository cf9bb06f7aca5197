"""An elastic reset's memory: the prediction that refuses a world too small
(merlin_models_de.elastic.memory) and the measured peak of a real reset."""

import json
import os
import subprocess
import sys

import pytest

from merlin_models_de.elastic.memory import reset_peak_bytes, reset_problem
from merlin_models_de.persistence.manifest import Part, SavedBlock
from merlin_models_de.planner import plan
from merlin_models_de.tables import FeatureSpec, TableSpec


class _Manifest:
    """The fields of a checkpoint's manifest that the prediction reads."""

    def __init__(self, blocks):
        self.blocks, self.step, self.path = blocks, 40, "/ckpt/step-40/manifest.json"


def _manifest(strategy="memory_balanced", slots=("accumulator",)):
    import numpy as np

    tables = (
        TableSpec("big", 1_000_000, 64, (FeatureSpec("big", "big"),)),
        TableSpec("small", 1_000, 16, (FeatureSpec("small", "small"),)),
    )
    saved = plan(tables, 2, strategy)
    parts = {
        t.name: tuple(
            Part(name, f"{t.name}/{name}", np.dtype("float32")) for name in ("table", *slots)
        )
        for t in tables
    }
    return _Manifest((SavedBlock("embeddings", saved, parts),))


def test_the_prediction_counts_slots_the_restore_buffer_and_a_table_drawn_whole():
    big, small = 1_000_000 * 64 * 4, 1_000 * 16 * 4
    # one rank: both tables with their slot, and one table's buffer while it is read; a table
    # drawn whole (two more copies of it) is less here
    assert reset_peak_bytes(_manifest(), 1) == [2 * (big + small) + big]
    assert reset_peak_bytes(_manifest(slots=()), 1) == [big + small + 2 * big]
    # two ranks (memory_balanced: the large table on rank 0) draw by blocks of rows
    assert reset_peak_bytes(_manifest(), 2) == [3 * big, 3 * small]


def test_a_reset_that_cannot_fit_is_refused_naming_the_need_and_the_ranks_that_would():
    need = reset_peak_bytes(_manifest(), 1)[0]
    assert reset_problem(_manifest(), 1, rank=0, ranks_on_host=1, available=need) is None
    assert reset_problem(_manifest(), 1, 0, 1, available=None) is None  # unknown: not checked
    problem = reset_problem(_manifest(), 1, rank=0, ranks_on_host=1, available=need // 2)
    assert problem == (
        "An elastic reset to 1 rank(s) would need 732.5 MiB on rank 0 (its share of the "
        "tables with their optimizer slots, as committed at step 40), more than the 366.3 MiB "
        "of memory available to each of the 1 rank(s) on its host: the job stops rather than "
        "be killed part-way. The commit /ckpt/step-40 is intact; resume it on more ranks: at "
        "least 3 ranks, 1 a host with memory like this one, would fit (horovodrun --min-np 3 "
        "waits for them). Received: world_size=1"
    )
    # the host's memory is shared by its ranks
    two = reset_problem(_manifest(), 2, rank=0, ranks_on_host=2, available=int(1.5 * need))
    assert "at least 3 ranks, 2 a host" in two


def test_a_reset_frees_the_old_model_and_restores_one_shard_at_a_time(tmp_path):
    """The peak of a real reset (one rank, 4 tables of 64 MB with Adagrad's slots: 512 MB)
    over the resident size with the old model alive. Holding the old model (a slice of each
    table, kept by the last checkpoint's write, held it) and reading every shard before
    writing added the new model and a copy of it (measured +1.25x); freed and streamed, the new
    model takes the old one's place and one table's buffer is added, with its conversion to a
    tensor (+0.25x measured)."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident size")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-m", "tests.unit.elastic_reset_probe", str(tmp_path / "ckpt")],
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONPATH": root},
        timeout=600,
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    added = (measured["peak"] - measured["before"]) / measured["model"]
    assert measured["model"] == 2 * 4 * 250_000 * 64 * 4
    assert added < 0.35, measured
