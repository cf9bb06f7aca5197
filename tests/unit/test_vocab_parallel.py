"""Vocab-parallel softmax cross-entropy and top-k in one process (world size 1).

The oracle is TensorFlow's own full computation: ``sparse_softmax_cross_entropy_with_logits``
and ``tf.math.top_k`` over ``hidden @ W^T + b``. The multi-process version of these checks is
tests/ranks/test_vocab_parallel.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.outputs.vocab_parallel import sharded_softmax_cross_entropy, sharded_top_k

BATCH, DIM, ROWS = 6, 4, 23


def data(seed=0, bias=True):
    rng = np.random.default_rng(seed)
    hidden = tf.constant(rng.normal(size=(BATCH, DIM)), tf.float32)
    table = tf.Variable(rng.normal(size=(ROWS, DIM)).astype(np.float32))
    b = tf.Variable(rng.normal(size=ROWS).astype(np.float32)) if bias else None
    targets = tf.constant(rng.integers(0, ROWS, BATCH))
    weights = tf.constant(rng.uniform(0.5, 2.0, BATCH), tf.float32)  # a non-uniform upstream
    return hidden, targets, table, b, weights


def full_logits(hidden, table, bias):
    logits = tf.matmul(hidden, table, transpose_b=True)
    return logits + bias if bias is not None else logits


def losses_and_grads(fn, hidden, table, bias, weights):
    sources = [hidden, table] + ([bias] if bias is not None else [])
    with tf.GradientTape() as tape:
        tape.watch(hidden)
        losses = fn()
        total = tf.reduce_sum(losses * weights)
    return losses, tape.gradient(total, sources)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("chunk", [1, 5, 23, 100])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_loss_and_gradients_equal_the_full_softmax(graph, chunk, bias):
    hidden, targets, table, b, weights = data(bias=bias)

    def run():
        ours = losses_and_grads(
            lambda: sharded_softmax_cross_entropy(
                hidden, targets, table, 0, ROWS, bias_rows=b, chunk_rows=chunk
            ),
            hidden,
            table,
            b,
            weights,
        )
        ref = losses_and_grads(
            lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(
                targets, full_logits(hidden, table, b)
            ),
            hidden,
            table,
            b,
            weights,
        )
        return ours, ref

    (losses, grads), (want, want_grads) = (tf.function(run) if graph else run)()
    np.testing.assert_allclose(losses.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert len(grads) == len(want_grads)
    for got, ref in zip(grads, want_grads):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), ref.numpy(), atol=1e-5)


def test_targets_of_shape_batch_by_one_and_int32():
    hidden, targets, table, b, _ = data()
    got = sharded_softmax_cross_entropy(
        hidden, tf.cast(targets[:, None], tf.int32), table, 0, ROWS, bias_rows=b, chunk_rows=7
    )
    want = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, full_logits(hidden, table, b))
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)


def test_large_logits_stay_finite():
    """The online log-sum-exp shifts by the running max: logits near 1e4 do not overflow."""
    hidden, targets, table, b, _ = data()
    hidden = hidden * 3000.0
    got = sharded_softmax_cross_entropy(hidden, targets, table, 0, ROWS, bias_rows=b, chunk_rows=4)
    want = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, full_logits(hidden, table, b))
    assert np.all(np.isfinite(got.numpy()))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("chunk", [1, 4, 23, 64])
@pytest.mark.parametrize("k", [1, 3, 23])
def test_top_k_equals_full_top_k(graph, chunk, k):
    hidden, _, table, b, _ = data(seed=3)
    fn = tf.function(sharded_top_k) if graph else sharded_top_k
    scores, ids = fn(hidden, k, table, 0, bias_rows=b, chunk_rows=chunk)
    want_scores, want_ids = tf.math.top_k(full_logits(hidden, table, b), k)
    assert ids.dtype == tf.int64 and ids.shape == (BATCH, k)
    np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
    np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 7, 23])
def test_top_k_ties_rank_the_lower_id_first(chunk):
    """Integer data: many exactly equal scores, across chunk boundaries."""
    rng = np.random.default_rng(5)
    hidden = tf.constant(rng.integers(-1, 2, (BATCH, DIM)), tf.float32)
    table = tf.constant(rng.integers(-1, 2, (ROWS, DIM)), tf.float32)
    scores, ids = sharded_top_k(hidden, 10, table, 0, chunk_rows=chunk)
    want_scores, want_ids = tf.math.top_k(full_logits(hidden, table, None), 10)
    np.testing.assert_array_equal(scores.numpy(), want_scores.numpy())
    np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())


def graph_tensors(graph, seen=None):
    """Every op output of ``graph`` and of the functions it calls (loop bodies too)."""
    seen = set() if seen is None else seen
    for op in graph.get_operations():
        yield from ((op, out) for out in op.outputs)
    for name, function in graph._functions.items():
        if name not in seen:
            seen.add(name)
            yield from graph_tensors(function.graph, seen)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_no_batch_by_rows_tensor_in_forward_or_backward(bias):
    """Memory: with chunk < rows, no tensor of the traced step (forward, backward and the
    loop bodies) pairs the batch with all the local rows; every batch-by-something float
    tensor has a static width (a chunk, the tail or the hidden width)."""
    rows, dim, chunk = 50, 3, 8  # distinct from each other and from the batch
    hidden, targets, _, _, weights = data()
    table = tf.Variable(tf.random.normal([rows, dim]))
    b = tf.Variable(tf.zeros([rows])) if bias else None
    hidden = hidden[:, :dim]

    @tf.function
    def step(hidden):
        sources = [hidden, table] + ([b] if bias else [])
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = sharded_softmax_cross_entropy(
                hidden, targets % rows, table, 0, rows, bias_rows=b, chunk_rows=chunk
            )
            total = tf.reduce_sum(loss * weights)
        return tape.gradient(total, sources)

    graph = step.get_concrete_function(tf.TensorSpec([None, dim])).graph
    shapes = [
        (op.type, tuple(out.shape))
        for op, out in graph_tensors(graph)
        if out.dtype.is_floating and out.shape.rank == 2
    ]
    widths = {s[1] for _, s in shapes}
    assert {chunk, rows % chunk} <= widths  # the chunked logits are there
    too_big = [(t, s) for t, s in shapes if rows in s and set(s) != {rows, dim}]
    assert not too_big, too_big
    assert not [(t, s) for t, s in shapes if s[1] is None], shapes


def expect_error(match, fn):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="(?s)" + match):
        fn()


def test_bad_input_raises_naming_the_call_and_the_value():
    hidden, targets, table, b, _ = data()
    bad = tf.tensor_scatter_nd_update(targets, [[2]], tf.constant([ROWS + 7], tf.int64))
    expect_error(
        r"'items'.*target ids must lie in the catalog.*\b30\b",
        lambda: sharded_softmax_cross_entropy(hidden, bad, table, 0, ROWS, name="items"),
    )
    expect_error(
        r"'items'.*target ids must lie in the catalog.*\n-1\n",
        lambda: sharded_softmax_cross_entropy(
            hidden, -tf.ones_like(targets), table, 0, ROWS, name="items"
        ),
    )
    expect_error(
        r"ranges must tile the catalog.*\b24\b",
        lambda: sharded_softmax_cross_entropy(hidden, targets, table, 0, ROWS + 1),
    )
    expect_error(
        r"ranges must tile the catalog",
        lambda: sharded_softmax_cross_entropy(hidden, targets, table, 3, ROWS),
    )
    expect_error(
        r"as wide as the hidden states \(column-sliced",
        lambda: sharded_softmax_cross_entropy(hidden, targets, table[:, :2], 0, ROWS),
    )
    expect_error(
        r"same number of rows.*\b6\b.*\b5\b",
        lambda: sharded_softmax_cross_entropy(hidden, targets[:5], table, 0, ROWS),
    )
    expect_error(
        r"bias_rows must be given.*one value per row",
        lambda: sharded_softmax_cross_entropy(hidden, targets, table, 0, ROWS, bias_rows=b[:5]),
    )
    expect_error(
        r"targets must be integer item ids.*float32",
        lambda: sharded_softmax_cross_entropy(hidden, tf.cast(targets, tf.float32), table, 0, ROWS),
    )
    expect_error(
        r"chunk_rows must be a positive int. Received: 0",
        lambda: sharded_softmax_cross_entropy(hidden, targets, table, 0, ROWS, chunk_rows=0),
    )
    expect_error(
        r"num_rows must be a positive int. Received: 0",
        lambda: sharded_softmax_cross_entropy(hidden, targets, table, 0, 0),
    )
    expect_error(
        r"table_rows must be a \[rows, dim\] tensor of hidden's dtype float32.*float64",
        lambda: sharded_softmax_cross_entropy(hidden, targets, tf.cast(table, tf.float64), 0, ROWS),
    )
    expect_error(
        r"sharded_top_k.*k must be at most the catalog size.*\b24\b.*\b23\b",
        lambda: sharded_top_k(hidden, ROWS + 1, table, 0),
    )
    expect_error(
        r"sharded_top_k.*k must be a positive int. Received: 0",
        lambda: sharded_top_k(hidden, 0, table, 0),
    )


def test_bad_targets_raise_in_graph_mode_too():
    hidden, targets, table, _, _ = data()
    fn = tf.function(lambda t: sharded_softmax_cross_entropy(hidden, t, table, 0, ROWS))
    expect_error(r"target ids must lie in the catalog.*\b23\b", lambda: fn(targets * 0 + ROWS))
