"""The tied CategoricalOutput over a DistributedEmbeddings table, in one process, against
Merlin's own ``mm.CategoricalOutput(to_call=mm.Embeddings(...)["item"])`` with the same
weights: the same logits, and ``fit`` gives the same per-step losses and final weights, both
through the full logits and through the vocab-parallel loss (``vocab_parallel=True``). The
2-rank version is tests/unit/horovod/test_tied_output.py."""
import numpy as np
import pytest
import tensorflow as tf

from tests.unit.horovod import tied_reference as tr
from tests.unit.horovod.fit_common import LossRecorder

BATCH, STEPS = 16, 4


def pair(spec):
    """Merlin's model and ours, ours set to Merlin's initial weights."""
    data = tr.make_data(BATCH * STEPS, seed=5)
    x, y = tr.split_xy(data)
    first = {k: tf.constant(v[:2]) for k, v in x.items()}
    merlin, merlin_block = tr.build_model({"block": "mm"})
    merlin(first)
    ours, block = tr.build_model(dict(spec, block="de"))
    ours(first)
    tr.restore(ours, block, {f"w/{k}": v for k, v in tr.snapshot(merlin, merlin_block).items()},
               "w")
    return (merlin, merlin_block), (ours, block), x, y


@pytest.mark.parametrize("vocab_parallel", [None, True], ids=["logits", "vocab_parallel"])
def test_logits_equal_merlins_categorical_output(vocab_parallel):
    (merlin, _), (ours, _), x, _ = pair({"vocab_parallel": vocab_parallel})
    got = ours.predict(x, batch_size=BATCH, verbose=0)
    want = merlin.predict(x, batch_size=BATCH, verbose=0)
    assert got.shape == (BATCH * STEPS, tr.ITEMS)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("vocab_parallel", [None, True], ids=["logits", "vocab_parallel"])
@pytest.mark.parametrize("optimizer, eager", [("sgd", False), ("adagrad", True)],
                         ids=["sgd-graph", "adagrad-eager"])
def test_fit_equals_merlins_categorical_output(vocab_parallel, optimizer, eager):
    spec = {"vocab_parallel": vocab_parallel, "chunk_rows": 7, "optimizer": optimizer,
            "eager": eager}
    (merlin, merlin_block), (ours, block), x, y = pair(spec)
    want = tr.train(merlin, x, y, BATCH, spec, 0.5)
    got = tr.train(ours, x, y, BATCH, spec, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    want_weights, got_weights = tr.snapshot(merlin, merlin_block), tr.snapshot(ours, block)
    for key, value in want_weights.items():
        np.testing.assert_allclose(got_weights[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert not np.allclose(got_weights["table/item"], tr.snapshot(*pair(spec)[1])["table/item"])
    evaluation = ours.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    expected = merlin.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert evaluation["loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_vocab_parallel_needs_its_target():
    ours, _ = tr.build_model({"block": "de", "vocab_parallel": True})
    x, _ = tr.split_xy(tr.make_data(8, seed=1))
    ours.compile(optimizer="sgd")
    with pytest.raises(ValueError, match="tied output over table 'item' needs the target "
                                         "'next_item'. Received targets: \\['other'\\]"):
        ours.fit(x, {"other": np.zeros((8, 1), np.int64)}, batch_size=8, verbose=0)


def test_the_table_handle_defaults_and_sharding():
    from merlin_models_de.outputs import CategoricalOutput, PerExampleLoss

    _, block = tr.build_model({"block": "de"})
    out = CategoricalOutput(to_call=block["item"])
    assert out.target == "prev_item"  # the table's first feature, as Merlin's default
    assert not out.to_call.vocab_parallel and not block["item"].sharded
    forced = CategoricalOutput(to_call=block["item"], target="next_item", vocab_parallel=True)
    assert isinstance(forced.default_loss, PerExampleLoss)
    assert forced.default_metrics_fn() == ()
    with pytest.raises(ValueError, match="logits_temperature is not supported on the sharded "
                                         "table 'item' yet. Received: logits_temperature=2"):
        CategoricalOutput(to_call=block["item"], vocab_parallel=True, logits_temperature=2.0)


def test_sample_weights_weigh_the_vocab_parallel_loss_as_merlins():
    spec = {"vocab_parallel": True, "optimizer": "sgd"}
    (merlin, merlin_block), (ours, block), x, y = pair(spec)
    weights = np.random.default_rng(3).uniform(0.2, 2.0, (len(y), 1)).astype(np.float32)
    losses = []
    for model in (merlin, ours):
        model.compile(optimizer=tr.optimizer("sgd", 0.5))
        recorder = LossRecorder()
        model.fit(tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(BATCH), verbose=0,
                  callbacks=[recorder])
        losses.append(recorder.losses)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tr.snapshot(ours, block)["table/item"],
                               tr.snapshot(merlin, merlin_block)["table/item"], rtol=1e-5,
                               atol=1e-6)
