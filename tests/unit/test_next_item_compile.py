"""``compile`` of a vocab-parallel tied output, in one process, against Merlin's own
``mm.CategoricalOutput`` with the same weights: compiled as Merlin's examples compile it
(``loss="categorical_crossentropy"``, ``TopKMetricsAggregator.default_metrics``) or with
nothing, ``fit``'s history (loss and top-k metrics) and the trained weights are Merlin's;
what the output cannot compute is refused naming it. The N-rank version, with Merlin's
transformer example, is tests/ranks/test_next_item_compile.py."""

import numpy as np
import pytest
import tensorflow as tf

from tests.ranks import tied_reference as tr
from tests.unit.test_outputs_tied import BATCH, TOP_K_METRICS, pair


def _example_arguments():
    import merlin.models.tf as mm

    return dict(
        loss="categorical_crossentropy",
        metrics=mm.TopKMetricsAggregator.default_metrics(top_ks=[10]),
    )


def _fit(model, x, y, arguments):
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.5), **arguments)
    return model.fit(tr.dataset(x, y, BATCH), epochs=2, verbose=0).history


@pytest.mark.parametrize("example", [True, False], ids=["merlins_example", "defaults"])
def test_fit_history_is_merlins(example):
    (merlin, merlin_block), (ours, block), x, y = pair({"vocab_parallel": True, "chunk_rows": 7})
    want = _fit(merlin, x, y, _example_arguments() if example else {})
    got = _fit(ours, x, y, _example_arguments() if example else {})
    for name in ("loss",) + TOP_K_METRICS:
        assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-7), name
    assert min(want["loss"]) > 1.0 and max(want["recall_at_10"]) > 0
    want_weights, got_weights = tr.snapshot(merlin, merlin_block), tr.snapshot(ours, block)
    for key, value in want_weights.items():
        np.testing.assert_allclose(got_weights[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    evaluation = ours.evaluate(tr.dataset(x, y, BATCH), verbose=0, return_dict=True)
    expected = merlin.evaluate(tr.dataset(x, y, BATCH), verbose=0, return_dict=True)
    for name in ("loss",) + TOP_K_METRICS:
        assert evaluation[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7), name


def test_one_top_k_metric_at_another_cutoff_is_that_metric():
    import merlin.models.tf as mm

    (merlin, _), (ours, _), x, y = pair({"vocab_parallel": True, "chunk_rows": 7})
    want = _fit(merlin, x, y, dict(metrics=[mm.RecallAt(5)]))
    got = _fit(ours, x, y, dict(metrics=[mm.RecallAt(5)]))
    assert sorted(k for k in got if k.startswith(("recall", "mrr", "ndcg", "map", "prec"))) == [
        "recall_at_5"
    ]
    assert got["recall_at_5"] == pytest.approx(want["recall_at_5"], rel=1e-5, abs=1e-7)


def _refusal(top_k=(10,), **arguments):
    import merlin.models.tf as mm

    from merlin_models_de.outputs.tied import TiedCategoricalOutput

    block = mm.DistributedEmbeddings(tr.schema(), dim=tr.DIM, backend="horovod")
    output = TiedCategoricalOutput(
        block["item"], target=tr.TARGET, vocab_parallel=True, top_k=top_k
    )
    model = mm.Model(mm.InputBlockV2(tr.schema(), categorical=block), tr.dense_layer(), output)
    with pytest.raises(ValueError) as raised:
        model.compile(optimizer="sgd", **arguments)
    return str(raised.value)


def test_what_the_output_cannot_compute_is_refused_naming_it():
    message = _refusal(loss="mse")
    assert "table 'item'" in message and "compile's loss" in message
    assert "Received: loss=" in message and "MeanSquaredError" in message
    smoothed = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)
    assert "no label smoothing" in _refusal(loss=smoothed)
    message = _refusal(metrics=[tf.keras.metrics.AUC(name="auc")])
    assert "compile's metrics can only hold Merlin's top-k metrics" in message
    assert "Received: metrics=" in message and "AUC" in message
    message = _refusal(top_k=(), metrics=_example_arguments()["metrics"])
    assert "top_k=()" in message
