"""The tied CategoricalOutput over a DistributedEmbeddings table, in one process, against
Merlin's own ``mm.CategoricalOutput(to_call=mm.Embeddings(...)["item"])`` with the same
weights: the same logits, and ``fit`` gives the same per-step losses and final weights, both
through the full logits and through the vocab-parallel loss (``vocab_parallel=True``). The
2-rank version is tests/ranks/test_tied_output.py."""

import numpy as np
import pytest
import tensorflow as tf

from tests.ranks import tied_reference as tr
from tests.ranks.oracle_dlrm import LossRecorder
from tests.tiers import diagonal

BATCH, STEPS = 16, 4
TOP_K_METRICS = ("recall_at_10", "mrr_at_10", "ndcg_at_10", "map_at_10", "precision_at_10")


def pair(spec):
    """Merlin's model and ours, ours set to Merlin's initial weights."""
    data = tr.make_data(BATCH * STEPS, seed=5)
    x, y = tr.split_xy(data)
    first = {k: tf.constant(v[:2]) for k, v in x.items()}
    merlin, merlin_block = tr.build_model({"block": "mm", "bias": spec.get("bias")})
    merlin(first)
    ours, block = tr.build_model(dict(spec, block="de"))
    ours(first)
    tr.restore(
        ours, block, {f"w/{k}": v for k, v in tr.snapshot(merlin, merlin_block).items()}, "w"
    )
    return (merlin, merlin_block), (ours, block), x, y


@pytest.mark.parametrize("vocab_parallel", [None, True], ids=["logits", "vocab_parallel"])
def test_logits_equal_merlins_categorical_output(vocab_parallel):
    (merlin, _), (ours, _), x, _ = pair({"vocab_parallel": vocab_parallel})
    got = ours.predict(x, batch_size=BATCH, verbose=0)
    want = merlin.predict(x, batch_size=BATCH, verbose=0)
    assert got.shape == (BATCH * STEPS, tr.ITEMS)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "vocab_parallel, optimizer_mode",
    diagonal(
        [None, True],
        [("sgd", False), ("adagrad", True)],
        ids=(
            lambda v: "vocab_parallel" if v else "logits",
            lambda o: f"{o[0]}-{'eager' if o[1] else 'graph'}",
        ),
    ),
)
def test_fit_equals_merlins_categorical_output(vocab_parallel, optimizer_mode):
    optimizer, eager = optimizer_mode
    spec = {
        "vocab_parallel": vocab_parallel,
        "chunk_rows": 7,
        "optimizer": optimizer,
        "eager": eager,
    }
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
    for name in ("loss",) + TOP_K_METRICS:  # the vocab-parallel top-k metrics equal Merlin's
        assert evaluation[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7), name
    assert expected["recall_at_10"] > 0  # the comparison means something


@pytest.mark.parametrize(
    "vocab_parallel",
    [pytest.param(None, marks=pytest.mark.full), True],
    ids=["logits", "vocab_parallel"],
)
def test_an_output_bias_trains_as_merlins(vocab_parallel):
    """``use_bias=True`` against Merlin's ``EmbeddingTablePrediction(use_bias=True)``:
    the same logits, per-step losses, tables, bias and top-k metrics."""
    spec = {"vocab_parallel": vocab_parallel, "chunk_rows": 7, "optimizer": "adagrad", "bias": True}
    (merlin, merlin_block), (ours, block), x, y = pair(spec)
    np.testing.assert_allclose(
        ours.predict(x, batch_size=BATCH, verbose=0),
        merlin.predict(x, batch_size=BATCH, verbose=0),
        rtol=1e-6,
        atol=1e-6,
    )
    want = tr.train(merlin, x, y, BATCH, spec, 0.5)
    got = tr.train(ours, x, y, BATCH, spec, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    want_weights, got_weights = tr.snapshot(merlin, merlin_block), tr.snapshot(ours, block)
    assert sorted(got_weights) == sorted(want_weights)
    for key, value in want_weights.items():
        np.testing.assert_allclose(got_weights[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    initial = tr.snapshot(*pair(spec)[1])["table/item_output_bias"]
    assert not np.allclose(got_weights["table/item_output_bias"], initial)  # the bias trained
    evaluation = ours.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    expected = merlin.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    for name in ("loss",) + TOP_K_METRICS:
        assert evaluation[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7), name


def test_vocab_parallel_needs_its_target():
    ours, _ = tr.build_model({"block": "de", "vocab_parallel": True})
    x, _ = tr.split_xy(tr.make_data(8, seed=1))
    ours.compile(optimizer="sgd")
    with pytest.raises(
        ValueError,
        match="tied output over table 'item' needs the target "
        "'next_item'. Received targets: \\['other'\\]",
    ):
        ours.fit(x, {"other": np.zeros((8, 1), np.int64)}, batch_size=8, verbose=0)


def test_the_table_handle_defaults_and_sharding():
    import merlin.models.tf as mm

    from merlin_models_de.outputs.tied import (
        TiedCategoricalOutput,
        TiedSoftmaxLoss,
        TiedTablePrediction,
    )

    _, block = tr.build_model({"block": "de"})
    for out in (TiedCategoricalOutput(to_call=block["item"]), mm.CategoricalOutput(block["item"])):
        assert isinstance(out.to_call, TiedTablePrediction)
        assert out.target == "prev_item"  # the table's first feature, as Merlin's default
        assert not out.to_call.vocab_parallel and not block["item"].sharded
    forced = TiedCategoricalOutput(
        to_call=block["item"], target="next_item", vocab_parallel=True, logits_temperature=2.0
    )
    assert isinstance(forced.default_loss, TiedSoftmaxLoss)
    # its default metrics: Merlin's top-k metrics at its cutoffs, which compile fills in
    (default,) = forced.default_metrics_fn()
    assert type(default).__name__ == "TargetRankMetrics" and default.entries is None
    assert forced.to_call.logits_temperature == 2.0 and forced.logits_temperature == 1.0


def test_the_default_loss_is_merlins_on_logits_and_the_mean_on_per_example_losses():
    """A saved single-process copy of a vocab-parallel output computes logits: the same
    default loss must then be Merlin's categorical cross-entropy."""
    from merlin.models.tf.losses import CategoricalCrossEntropy

    from merlin_models_de.outputs.tied import TiedSoftmaxLoss

    logits = tf.constant([[1.0, 2.0, 0.5], [0.1, -1.0, 3.0]])
    onehot = tf.constant([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    want = CategoricalCrossEntropy()(onehot, logits)
    assert float(TiedSoftmaxLoss()(onehot, logits)) == pytest.approx(float(want), rel=1e-6)
    per_example = tf.constant([0.5, 1.5, 4.0])
    assert float(TiedSoftmaxLoss()(tf.zeros([3]), per_example)) == pytest.approx(2.0)


def test_sample_weights_weigh_the_vocab_parallel_loss_as_merlins():
    spec = {"vocab_parallel": True, "optimizer": "sgd"}
    (merlin, merlin_block), (ours, block), x, y = pair(spec)
    weights = np.random.default_rng(3).uniform(0.2, 2.0, (len(y), 1)).astype(np.float32)
    losses = []
    for model in (merlin, ours):
        model.compile(optimizer=tr.optimizer("sgd", 0.5))
        recorder = LossRecorder()
        model.fit(
            tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(BATCH),
            verbose=0,
            callbacks=[recorder],
        )
        losses.append(recorder.losses)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        tr.snapshot(ours, block)["table/item"],
        tr.snapshot(merlin, merlin_block)["table/item"],
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.full  # the sharded twin: horovod/test_tied_output.py
def test_a_saved_model_with_the_tied_output_reloads_onto_its_own_table(tmp_path):
    """The output's config names the table; loading binds it to the loaded model's block,
    not to the (still alive) original's."""
    import merlin.models.tf as mm

    from merlin_models_de.variables import embedding_blocks

    model, block = tr.build_model({"block": "de", "plain": True})
    x, y = tr.split_xy(tr.make_data(BATCH * 2, seed=4))
    model.compile(optimizer="sgd")
    model.fit(tr.dataset(x, y, BATCH), verbose=0)
    want = model.predict(tr.dataset(x, y, BATCH), verbose=0)
    model.save(str(tmp_path / "saved"))
    loaded = tf.keras.models.load_model(str(tmp_path / "saved"))
    got = loaded.predict(tr.dataset(x, y, BATCH), verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    (loaded_block,) = embedding_blocks(loaded)
    (output,) = loaded.model_outputs
    assert isinstance(output, mm.CategoricalOutput)
    assert output.to_call.table.block is loaded_block and loaded_block is not block
    loaded.compile(optimizer="sgd")  # trains on, with the table tied
    loaded.fit(tr.dataset(x, y, BATCH), verbose=0)
    assert not np.allclose(loaded.predict(tr.dataset(x, y, BATCH), verbose=0), got)


def test_a_table_name_no_block_holds_is_named():
    from merlin_models_de.outputs.tied import TiedTablePrediction

    with pytest.raises(
        ValueError,
        match=r"Cannot bind table 'no_such_table': names are bound "
        r"only while a model is rebuilt from its config",
    ):
        TiedTablePrediction("no_such_table")


def test_two_models_with_the_same_table_names_never_bind_each_other():
    """No process-wide registry: each model rebuilt from its config binds its own block, even
    when another model with the same table names was built later; outside a rebuild a name
    binds nothing, and ``named_tables`` binds exactly the blocks it is given."""
    import merlin_models_de
    from merlin_models_de.outputs.tied import TiedTablePrediction
    from merlin_models_de.variables import embedding_blocks

    first, first_block = tr.build_model({"block": "de", "plain": True})
    second, second_block = tr.build_model({"block": "de", "plain": True})
    assert first_block is not second_block
    (tied,) = first.model_outputs
    assert tied.to_call.table.block is first_block  # bound by object at construction
    copy = first.__class__.from_config(first.get_config())
    (copy_block,) = embedding_blocks(copy)
    (copy_output,) = copy.model_outputs
    assert copy_output.to_call.table.block is copy_block
    assert copy_block not in (first_block, second_block)
    with merlin_models_de.named_tables(first_block):
        assert TiedTablePrediction("item").table.block is first_block
    with merlin_models_de.named_tables(second_block):
        assert TiedTablePrediction("item").table.block is second_block
    with pytest.raises(ValueError, match=r"Cannot bind table 'item'"):
        TiedTablePrediction("item")
