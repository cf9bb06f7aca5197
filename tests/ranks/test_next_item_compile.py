"""Merlin's transformer next-item example, compiled as Merlin's notebooks compile it
(``loss="categorical_crossentropy"``, ``metrics=TopKMetricsAggregator.default_metrics(
top_ks=[10])``), over a row-sliced item table on N ranks: the loss, the top-k metrics in
``fit``'s history and ``evaluate``, and the trained weights equal one process (Merlin's own
full-softmax output) on the global batches."""

import json

import numpy as np
import pytest

from merlin_models_de import comm
from merlin_models_de.planner.types import ShardingType
from merlin_models_de.variables import embedding_blocks
from tests.ranks import oracle_dlrm as fc
from tests.ranks import transformer_example as te
from tests.ranks.test_fit import reference

PER_RANK, STEPS = 8, 3
TOP_K = ("recall_at_10", "mrr_at_10", "ndcg_at_10", "map_at_10", "precision_at_10")


def rank_model(spec, data):
    """This rank's model, its rows of ``data`` and its masks."""
    n, r = comm.size(), comm.rank()
    model, xlnet_block = te.build_model(spec)
    mine = te.take_rows(data, fc.rank_rows(len(data["lengths"]), PER_RANK, n, r))
    train_pre, last = te.masks(spec, xlnet_block)
    return model, mine, train_pre, last


@pytest.mark.full  # 93 s; the CI tier runs the example as written (below, 19 s)
def test_the_example_trains_and_reports_top_k_metrics_as_one_process(hvd, tmp_path_factory):
    n = comm.size()
    spec = dict(fixed=True, lr=0.01, world_size=n, per_rank=PER_RANK, row=300)
    data = comm.broadcast_object(te.make_data(n * PER_RANK * STEPS, seed=11))
    ref = reference(
        spec, data, str(tmp_path_factory.mktemp("ref")), "tests.ranks.transformer_example"
    )

    model, mine, train_pre, last = rank_model(spec, data)
    te.build_every_weight(model, mine, PER_RANK, train_pre)
    fc.restore(model, ref, "initial")
    (block,) = embedding_blocks(model)
    assert block.plan.kind_of(te.ITEM) is ShardingType.ROW_WISE and block[te.ITEM].sharded
    te.compile_as_the_example(model, spec["lr"])  # Merlin scales the learning rate by n
    steps = te.StepLosses()
    history = model.fit(
        te.batches(mine, PER_RANK), epochs=1, verbose=0, callbacks=[steps], pre=train_pre
    ).history

    want = json.loads(str(ref["history"]))
    # each rank's loss is its share of the global mean: their mean is one process's loss
    per_step = np.mean(comm.allgather_object(steps.losses), axis=0)
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-4, atol=1e-5)
    assert per_step.min() > 1.0  # a cross-entropy over 60 items, not 0.0
    # the top-k metrics are sums over ranks: every rank's history is one process's. The
    # ranks' batches hold sequences of other lengths than the global batch (rank 0's longest
    # is 5, the global batch's 6): XLNet's outputs depend on the padding, so each rank pads
    # to the global batch's longest sequence, or the positions in the top 10 (mrr, ndcg, map)
    # differ from one process's by up to 0.006
    assert [max(data["lengths"][i : i + PER_RANK]) for i in (0, PER_RANK)] == [5, 6]
    for name in TOP_K:
        assert history[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), name
    assert want["recall_at_10"][0] > 0
    # the trained weights are one process's too
    for key, value in fc.snapshot(model).items():
        want_value = ref[f"final/{key}"]
        if value.dtype == bool:  # XLNet holds a flag among its weights
            np.testing.assert_array_equal(value, want_value, err_msg=key)
        else:
            np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-6, err_msg=key)
    # evaluate from the reference's weights: near-ties in the top 10 see no rounding
    fc.restore(model, ref, "final")
    evaluation = model.evaluate(te.batches(mine, PER_RANK), verbose=0, return_dict=True, pre=last)
    want = json.loads(str(ref["evaluation"]))
    assert evaluation["loss"] == pytest.approx(want["loss"], rel=1e-4)
    for name in TOP_K:
        assert evaluation[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), name


# the CI tier's run of Merlin's example (the exact oracle above is in the full tier)
def test_the_example_as_written_reports_a_loss_and_top_k_metrics(hvd):
    """The example's random masks and dropout: no exact oracle, but a cross-entropy (not
    0.0) and every top-k metric, the same on every rank."""
    n = comm.size()
    spec = dict(fixed=False, row=300)
    data = comm.broadcast_object(te.make_data(n * PER_RANK * 2, seed=12))
    model, mine, train_pre, _ = rank_model(spec, data)
    te.compile_as_the_example(model, 0.01)
    history = model.fit(te.batches(mine, PER_RANK), epochs=1, verbose=0, pre=train_pre).history
    assert history["loss"][0] > 1.0, history
    every_rank = comm.allgather_object({name: history[name] for name in TOP_K})
    assert every_rank[0] == every_rank[-1]
    assert all(0.0 <= history[name][0] <= 1.0 for name in TOP_K)


def test_a_loss_or_metric_the_output_cannot_compute_is_refused_on_every_rank(hvd):
    import tensorflow as tf

    model, _, _, _ = rank_model(
        dict(fixed=True, row=300), te.make_data(comm.size() * PER_RANK, seed=1)
    )
    outcomes = []
    for kwargs in (dict(loss="mse"), dict(metrics=[tf.keras.metrics.AUC()])):
        with pytest.raises(ValueError) as raised:
            model.compile(optimizer="adam", **kwargs)
        outcomes.append(str(raised.value))
    assert "table 'item_id-list'" in outcomes[0] and "Received: loss=" in outcomes[0]
    assert "Received: metrics=" in outcomes[1] and "AUC" in outcomes[1]
    assert comm.allgather_object(outcomes)[0] == outcomes  # the same refusal on every rank
