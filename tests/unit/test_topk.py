"""Top-k prediction over a DistributedEmbeddings table (merlin_models_de.outputs.topk) in one
process: ``top_k_model`` of a trained next-item model returns ``tf.math.top_k`` of its full
logits (output bias included) and Merlin's top-k metrics of the exact target ranks. The
2-rank version (sharded table, table-wise and row-sliced) is in
tests/ranks/test_tied_output.py."""

import numpy as np
import pytest
import tensorflow as tf

import merlin_models_de
from merlin_models_de.outputs.topk import ShardedTopK, sharded_top_k_layer
from tests.ranks import tied_reference as tr

BATCH = 16


@pytest.mark.parametrize(
    "bias, vocab_parallel, chunk_rows",
    [pytest.param(True, None, 7, marks=pytest.mark.full), (True, True, 50), (False, True, 3)],
)
def test_top_k_model_returns_the_top_k_of_the_full_logits(bias, vocab_parallel, chunk_rows):
    model, _ = tr.build_model(
        {"block": "de", "bias": bias, "vocab_parallel": vocab_parallel, "chunk_rows": chunk_rows}
    )
    x, y = tr.split_xy(tr.make_data(BATCH * 4, seed=3))
    tr.train(model, x, y, BATCH, {"optimizer": "adagrad"}, 0.5)
    logits = model({k: tf.constant(v) for k, v in x.items()}).numpy()
    trained = [w.numpy() for w in model.weights]
    top_k = tr.top_k_outputs(model, x, y, BATCH)
    # the trained model is left as it was (mm.Model.build rebuilds every Keras layer it is
    # given: top_k_model must not hand it the trained ones)
    for before, after in zip(trained, model.weights):
        np.testing.assert_array_equal(after.numpy(), before)
    want = tf.math.top_k(logits, 10)
    np.testing.assert_array_equal(top_k["top_k/ids"], want.indices.numpy())
    np.testing.assert_allclose(top_k["top_k/scores"], want.values.numpy(), rtol=1e-6, atol=1e-6)
    exact = tr.exact_top_k_metrics(logits, y.reshape(-1))
    assert exact["exact/recall_at_10"] > 0
    for name in ("recall_at_10", "mrr_at_10", "ndcg_at_10", "map_at_10", "precision_at_10"):
        assert top_k[f"top_k/{name}"] == pytest.approx(exact[f"exact/{name}"], rel=1e-5), name


def test_a_smaller_k_and_the_default_top_k_of_merlins_output():
    model, block = tr.build_model({"block": "de", "bias": True})
    x, _ = tr.split_xy(tr.make_data(8, seed=4))
    layer = ShardedTopK.from_output(model.blocks[-1], k=3)
    assert layer.bias_table == "item_output_bias" and layer.table is block["item"]
    hidden = model.blocks[1](model.blocks[0]({k: tf.constant(v) for k, v in x.items()}))
    scores, ids = layer(hidden)
    want = tf.math.top_k(model.blocks[-1].to_call(hidden), 3)
    np.testing.assert_array_equal(ids.numpy(), want.indices.numpy())
    np.testing.assert_allclose(scores.numpy(), want.values.numpy(), rtol=1e-6, atol=1e-6)
    # one process holds the table whole: to_top_k_encoder keeps Merlin's own path
    assert sharded_top_k_layer(model.blocks[-1]) is None
    with merlin_models_de.named_tables(block, model.blocks[-1].to_call.bias_block):
        again = ShardedTopK.from_config(layer.get_config())
    assert again.table is block["item"] and again._k == 3


def test_bad_arguments_are_named():
    import merlin.models.tf as mm

    model, block = tr.build_model({"block": "de"})
    with pytest.raises(ValueError, match=r"needs k >= 1. Received: k=0"):
        ShardedTopK(block["item"], k=0)
    with pytest.raises(
        ValueError,
        match=r"Cannot bind table 'nope': names are bound only "
        r"while a model is rebuilt from its config",
    ):
        ShardedTopK("nope")
    with pytest.raises(
        TypeError,
        match=r"takes a table of a DistributedEmbeddings block.*Received: EmbeddingTable",
    ):
        ShardedTopK(mm.Embeddings(tr.schema(), dim=4)["item"])
    with pytest.raises(NotImplementedError, match=r"scores table 'item' where it lies"):
        ShardedTopK(block["item"]).index(tf.zeros([3, 8]))
    with pytest.raises(
        TypeError,
        match=r"from_output takes an output tied to a "
        r"DistributedEmbeddings table. Received: Dense",
    ):
        ShardedTopK.from_output(tf.keras.layers.Dense(3))
    del model
