"""exchange_dtype in one process: rows and their gradients rounded exactly once each way,
as they are when they cross ranks (the 2-rank oracle: horovod/test_oracle.py)."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings
from merlin_models_de.backends.distributed_embeddings import DistributedEmbeddingsBackend
from tests.ranks import oracle


def block(exchange_dtype=None, **options):
    return DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        sequence_combiner=oracle.SEQUENCE_COMBINERS,
        backend="horovod",
        exchange_dtype=exchange_dtype,
        **options,
    )


def outputs_and_gradients(emb, inputs, arrays, weights):
    emb(inputs)
    emb.set_global_weights(arrays)
    with tf.GradientTape() as tape:
        out = emb(inputs)
        # a gradient per output element that float16 / bfloat16 cannot hold exactly
        loss = tf.add_n([tf.reduce_sum(out[k] * weights[k]) for k in sorted(out)])
    grads = tape.gradient(loss, emb.trainable_variables)
    return out, {
        v.name: tf.convert_to_tensor(g).numpy()
        for v, g in zip(emb.trainable_variables, grads)
        if g is not None
    }


def rounded(x, dtype):
    return tf.cast(tf.cast(x, dtype), x.dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", tf.bfloat16])
def test_rows_and_gradients_are_rounded_once_each_way(dtype):
    plain, narrow = block(), block(dtype)
    batch = oracle.global_batch(plain.features, plain.tables, 8, 0)
    inputs = oracle.select(batch, 0, 8)
    arrays = oracle.global_tables(plain.tables, 1)
    rng = np.random.default_rng(2)
    weights = {}
    for f in plain.features:
        dim = plain.plan.table(f.table).dim
        weights[f.name] = tf.constant(rng.normal(size=dim) * 1.001, tf.float32)
    want_out, want_grads = outputs_and_gradients(plain, inputs, arrays, weights)
    got_out, got_grads = outputs_and_gradients(narrow, inputs, arrays, weights)
    name = tf.as_dtype(dtype).name
    for k, want in want_out.items():
        if isinstance(want, tf.RaggedTensor):
            want, got = want.flat_values, got_out[k].flat_values
        else:
            got = got_out[k]
        np.testing.assert_array_equal(got.numpy(), rounded(want, name).numpy(), err_msg=k)
        assert not np.array_equal(got.numpy(), want.numpy()), k  # really rounded
    # the gradient of each looked-up row is the rounded output gradient, summed per id
    plain_rounded = {}
    for f in plain.features:
        plain_rounded[f.name] = rounded(weights[f.name], name)
    _, want_grads_rounded = outputs_and_gradients(block(), inputs, arrays, plain_rounded)
    assert sorted(got_grads) == sorted(want_grads_rounded)
    for k, want in want_grads_rounded.items():
        np.testing.assert_allclose(got_grads[k], want, rtol=1e-6, atol=0, err_msg=k)
        if "exchange_anchor" in k:  # read as an exact 0 by every output: its gradient is 0
            assert got_grads[k] == 0.0 and want_grads[k] == 0.0, k
            continue
        assert not np.allclose(got_grads[k], want_grads[k], rtol=1e-7, atol=0), k


def test_config_round_trip_keeps_the_exchange_dtype():
    emb = block("bfloat16")
    again = DistributedEmbeddings.from_config(emb.get_config())
    assert again.exchange_dtype == "bfloat16"
    assert again.backend.exchange_dtype == "bfloat16"
    assert block().get_config()["exchange"]["exchange_dtype"] is None


@pytest.mark.parametrize("value", ["int8", "float64", "fp16", tf.float32])
def test_an_unknown_exchange_dtype_is_named(value):
    with pytest.raises(ValueError) as err:
        block(value)
    assert str(err.value) == (
        "exchange_dtype must be None (rows travel in the block's dtype) or one of "
        f"['float16', 'bfloat16']. Received: exchange_dtype={value!r}"
    )


def test_distributed_embeddings_backend_refuses_a_narrow_exchange():
    features = block().features
    assert DistributedEmbeddingsBackend.unsupported(features[:1], "float16") == (
        "backend='distributed-embeddings' exchanges rows in the block's dtype only; use "
        "backend='horovod' (or 'auto') for a narrower exchange. Received: "
        "exchange_dtype='float16'"
    )
