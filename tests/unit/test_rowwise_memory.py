"""RowWiseAdagrad in the memory model, the plan summary and the plan command: its state is
one value per row held (rows, not rows * dim)."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, RowWiseAdagrad
from merlin_models_de.apps.common.schemas import synthetic_schema
from merlin_models_de.apps.tools.plan import busiest_elements, main, smallest_world_size
from merlin_models_de.merlin.optimizers import slot_copies
from merlin_models_de.planner import optimizer_slots, plan, row_slots
from merlin_models_de.planner.memory import (
    DENSE_GRADIENT_COPIES,
    DRAWN_WHOLE_KEPT,
    plan_peak_bytes,
    rank_peak_bytes,
    replicated_peak_bytes,
)
from merlin_models_de.tables import FeatureSpec, TableSpec, human_bytes, tables_from_schema
from tests.schemas import cat


def tables(*shapes):
    return [
        TableSpec(f"t{i}", rows, dim, (FeatureSpec(f"t{i}", f"t{i}"),))
        for i, (rows, dim) in enumerate(shapes)
    ]


def rows_on(p, rank):
    return sum(s.rows for s in p.shards_on(rank))


def test_the_state_is_a_value_per_row():
    assert (optimizer_slots("rowwise_adagrad"), row_slots("rowwise_adagrad")) == (0, 1)
    assert row_slots("adagrad") == 0
    with pytest.raises(ValueError, match="Received: optimizer='rowwise'"):
        row_slots("rowwise")
    assert (
        rank_peak_bytes(1000, "rowwise_adagrad", runtime=0, rows=250, overhead=0)
        == (1000 + 250) * 4
    )
    assert rank_peak_bytes(1000, "adagrad", runtime=0, rows=250, overhead=0) == 2 * 1000 * 4
    # every table whole on each of 2 ranks (mm.Embeddings: element-wise Adagrad state, the
    # block's row-wise state is not theirs), gradients allreduced dense, each table drawn whole
    four = tables(*[(100, 8)] * 4)
    assert replicated_peak_bytes(four, "rowwise_adagrad", 2, runtime=0, overhead=0) == int(
        3200 * (2 + DENSE_GRADIENT_COPIES) * 4 + DRAWN_WHOLE_KEPT * 800 * 4
    )


def test_a_plans_peaks_and_summary_count_each_ranks_rows():
    # a row-sliced and a column-sliced table: each shard's rows hold state
    p = plan(
        tables((8000, 8), (3000, 16), (50, 4)),
        2,
        strategy="memory_balanced",
        row_slice_threshold=60_000,
        column_slice_threshold=40_000,
    )
    kinds = {s.kind.value for s in p.shards}
    assert {"row_wise", "column_wise"} <= kinds, kinds
    want = [(p.rank_elements(r) + rows_on(p, r)) * 4 for r in range(2)]
    assert plan_peak_bytes(p, "rowwise_adagrad", runtime=0, overhead=0) == want
    text = p.summary("rowwise_adagrad")
    assert "optimizer=rowwise_adagrad (+0 slot copies, +1 value per row)" in text
    for r in range(2):
        params = p.rank_elements(r) * 4
        line = f"{r:>4} {len(p.shards_on(r)):>6} {rows_on(p, r):>14,} "
        line += f"{human_bytes(params):>12} {human_bytes(want[r]):>12}"
        assert line in text
    assert f"{human_bytes(sum(want))} with slots" in text
    # against Adagrad's copy of every element: the saving is elements - rows
    adagrad = plan_peak_bytes(p, "adagrad", runtime=0, overhead=0)
    assert [a - w for a, w in zip(adagrad, want)] == [
        (p.rank_elements(r) - rows_on(p, r)) * 4 for r in range(2)
    ]


def test_smallest_world_size_counts_the_row_state():
    criteo = tables_from_schema(synthetic_schema("criteo"), dim=16)
    options = dict(strategy="memory_optimized", column_slice_threshold=2**24)
    fit = smallest_world_size(criteo, 10**9, "rowwise_adagrad", **options)
    n = fit.world_size
    p = plan(criteo, n, **options)
    assert fit.busiest_bytes == max((p.rank_elements(r) + rows_on(p, r)) * 4 for r in range(n))
    assert fit.busiest_bytes <= 10**9
    assert busiest_elements(criteo, n - 1, copies=1, per_row=1, **options) * 4 > 10**9
    # fewer ranks than Adagrad needs
    assert n < smallest_world_size(criteo, 10**9, "adagrad", **options).world_size


def test_the_plan_command_takes_the_optimizer(capsys):
    argv = ["criteo", "--world-size", "2", "--optimizer", "rowwise_adagrad"]
    assert main(argv + ["--strategy", "memory_optimized"]) == 0
    out = capsys.readouterr().out
    assert "optimizer=rowwise_adagrad (+0 slot copies, +1 value per row)" in out
    p = plan(tables_from_schema(synthetic_schema("criteo"), dim=16), 2, strategy="memory_optimized")
    peaks = ", ".join(
        f"r{r} {human_bytes(b)}" for r, b in enumerate(plan_peak_bytes(p, "rowwise_adagrad"))
    )
    assert peaks in out


def test_a_compiled_model_summarizes_its_row_state():
    block = DistributedEmbeddings(Schema([cat("user", 99), cat("item", 49)]), dim=4)
    # linear: a ReLU layer whose units are all dead for a sample would give its rows no
    # gradient, and the count below would depend on the draw
    model = mm.Model(block, mm.MLPBlock([4], activation="linear"), mm.BinaryOutput("click"))
    model.compile(optimizer=RowWiseAdagrad(0.1))
    assert slot_copies(model.optimizer) == ("rowwise_adagrad", 0)
    assert "optimizer=rowwise_adagrad (+0 slot copies, +1 value per row)" in block.summary()
    x = {"user": tf.constant([[1], [2]]), "item": tf.constant([[3], [4]])}
    model.fit(x, tf.constant([[1.0], [0.0]]), batch_size=2, verbose=0)
    # the user table's state: its two looked-up rows moved, the other 98 did not
    (state,) = [v for v in model.optimizer.variables() if v.shape == (100, 1)]
    assert np.count_nonzero(state.numpy() != np.float32(0.1)) == 2
