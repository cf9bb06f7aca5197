"""An elastic reset's memory: the prediction that refuses a world too small
(merlin_models_de.elastic.memory) and the measured peak of a real reset."""

import json
import math
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


def _manifest(strategy="memory_balanced", slots=("accumulator",), per_row=False, options=()):
    """A commit of 2 ranks: tables big (1M x 64), small (1k x 16) and tiny (10 x 4), each
    with ``slots`` (one value per row with ``per_row``)."""
    import numpy as np

    tables = tuple(
        TableSpec(name, rows, dim, (FeatureSpec(name, name),))
        for name, rows, dim in (("big", 1_000_000, 64), ("small", 1_000, 16), ("tiny", 10, 4))
    )
    saved = plan(tables, 2, strategy, **dict(options))
    parts = {
        t.name: (Part("table", f"{t.name}/table", np.dtype("float32")),)
        + tuple(Part(n, f"{t.name}/{n}", np.dtype("float32"), per_row) for n in slots)
        for t in tables
    }
    return _Manifest((SavedBlock("embeddings", saved, parts),))


BIG, SMALL, TINY = 1_000_000 * 64 * 4, 1_000 * 16 * 4, 10 * 4 * 4


def test_the_prediction_counts_slots_the_restore_buffer_and_a_table_drawn_whole():
    tables = BIG + SMALL + TINY
    # one rank: the tables with their slot, and the largest part twice while it is read and
    # converted; a table drawn whole (two more copies of it) is less here
    assert reset_peak_bytes(_manifest(), 1, overhead=0) == [2 * tables + 2 * BIG]
    assert reset_peak_bytes(_manifest(slots=()), 1, overhead=0) == [tables + 2 * BIG]
    # two ranks (memory_balanced, largest first: big on rank 0, small and tiny on rank 1)
    assert reset_peak_bytes(_manifest(), 2, overhead=0) == [4 * BIG, 2 * (SMALL + TINY) + 2 * SMALL]


def test_a_dynamic_tables_key_map_and_candidates_are_counted():
    """A dynamic table's share holds its key map and candidates as the planner counts them
    (KEY_MAP_BYTES_PER_ROW a slot), beside its rows."""
    import numpy as np

    from merlin_models_de import DynamicTable
    from merlin_models_de.persistence.manifest import SavedMap
    from merlin_models_de.planner.types import KEY_MAP_BYTES_PER_ROW

    option = DynamicTable(capacity=1_000, admit_after=2, candidates=300)
    table = TableSpec("item", 1_000, 16, (FeatureSpec("item", "item"),), option)
    saved = plan((table,), 2)
    part = (Part("table", "item/table", np.dtype("float32")),)
    stems = {"keymap": "k", "candidates": "c", "counters": "n"}
    manifest = _Manifest(
        (SavedBlock("embeddings", saved, {"item": part}, {"item": SavedMap(stems, option)}),)
    )
    rows = 1_000 * 16 * 4
    # one rank: its rows, twice more while read and converted, 1000 slots and 300 candidates
    assert reset_peak_bytes(manifest, 1, overhead=0) == [3 * rows + 1_300 * KEY_MAP_BYTES_PER_ROW]
    # two ranks of 500 rows: each its half, 500 slots and 300 candidates
    half = rows // 2
    assert reset_peak_bytes(manifest, 2, overhead=0) == [3 * half + 800 * KEY_MAP_BYTES_PER_ROW] * 2


def test_restored_parts_are_resident_the_allocators_overhead_above_their_bytes():
    """As the plan's memory model (planner/memory.py): TF's allocator keeps about 5% above a
    large allocation's bytes; the restore's buffers are not counted twice."""
    tables = BIG + SMALL + TINY
    assert reset_peak_bytes(_manifest(), 1) == [math.ceil(2 * tables * 1.05) + 2 * BIG]
    assert reset_peak_bytes(_manifest(), 2, overhead=0.1) == [
        math.ceil(2 * BIG * 1.1) + 2 * BIG,
        math.ceil(2 * (SMALL + TINY) * 1.1) + 2 * SMALL,
    ]


def test_the_prediction_counts_per_row_state_a_column_wide_and_replicas_on_every_rank():
    rows = (1_000_000 + 1_000 + 10) * 4  # one float per row of each table
    assert reset_peak_bytes(_manifest(per_row=True), 1, overhead=0) == [
        BIG + SMALL + TINY + rows + 2 * BIG
    ]
    # the commit's own options re-plan the new world: tiny (40 elements) replicated
    replicated = _manifest(per_row=True, options={"data_parallel_threshold": 40})
    two = reset_peak_bytes(replicated, 2, overhead=0)
    assert two == [BIG + 4_000_000 + TINY + 40 + 2 * BIG, SMALL + 4_000 + TINY + 40 + 2 * SMALL]


def test_a_reset_that_cannot_fit_is_refused_naming_the_need_and_the_ranks_that_would():
    need = reset_peak_bytes(_manifest(), 1)[0]
    assert reset_problem(_manifest(), 1, rank=0, ranks_on_host=1, available=need) is None
    assert reset_problem(_manifest(), 1, 0, 1, available=None) is None  # unknown: not checked
    problem = reset_problem(_manifest(), 1, rank=0, ranks_on_host=1, available=need // 2)
    assert problem == (
        "An elastic reset to 1 rank(s) would need 1001.1 MiB on rank 0 (its share of the "
        "tables with their optimizer slots, as committed at step 40), more than the 500.6 MiB "
        "of memory available to each of the 1 rank(s) on its host: the job stops rather than "
        "be killed part-way. The commit /ckpt/step-40 is intact; resume it on more ranks: at "
        "least 4 ranks, 1 a host with memory like this one, would fit (horovodrun --min-np 4 "
        "waits for them). Received: world_size=1"
    )
    # the host's memory is shared by its ranks
    two = reset_problem(_manifest(), 2, rank=0, ranks_on_host=2, available=int(1.5 * need))
    assert "at least 4 ranks, 2 a host" in two


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
