"""Vocab-parallel softmax cross-entropy and top-k on N ranks == one process on the global batch.

Each rank holds a row range of the item table (even split, everything on the last rank so
the others hold 0 rows, or ranges in reverse rank order) and its own examples; the oracle
is TensorFlow's full softmax / top-k over the whole table and the global batch, computed on
every rank without collectives.

Graph mode is the hard case: a rank holding 0 rows reads none of the gathered data, and
Horovod's graph collectives are not stateful ops, so without data dependencies TF pruned
that rank's collective and the others waited forever (run with MMDE_TEST_TIMEOUT to fail
fast should that come back).
"""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.outputs.vocab_parallel import (
    sharded_logits,
    sharded_softmax_cross_entropy,
    sharded_top_k,
)
from merlin_models_de.planner.slicing import row_ranges
from merlin_models_de.variables import mark_local
from tests.tiers import diagonal

# a rank's rows: evenly split, all on the last rank, or in reverse order
KINDS = ["even", "last_rank_only", "reversed"]

DIM, ROWS = 4, 23


def layout(kind, n):
    """(row_offset, rows) of every rank."""
    if kind == "even":
        return row_ranges(ROWS, n)
    if kind == "last_rank_only":  # table-wise: the other ranks hold 0 rows
        return [(0, 0)] * (n - 1) + [(0, ROWS)]
    return list(reversed(row_ranges(ROWS, n)))  # rank 0 holds the last rows


def batch_sizes(uneven, n):
    return [3 + 2 * r for r in range(n)] if uneven else [4] * n


def global_data(n, uneven=False, seed=0, integer=False):
    rng = np.random.default_rng(seed)
    sizes = batch_sizes(uneven, n)
    total = sum(sizes)
    if integer:  # exact ties for top-k
        hidden = rng.integers(-1, 2, (total, DIM)).astype(np.float32)
        table = rng.integers(-1, 2, (ROWS, DIM)).astype(np.float32)
    else:
        hidden = rng.normal(size=(total, DIM)).astype(np.float32)
        table = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    return dict(
        sizes=sizes,
        hidden=hidden,
        table=table,
        bias=rng.normal(size=ROWS).astype(np.float32),
        targets=rng.integers(0, ROWS, total),
        weights=rng.uniform(0.5, 2, total).astype(np.float32),
    )


def mine(g, kind):
    """This rank's examples and rows of the global data."""
    r, n = comm.rank(), comm.size()
    start = sum(g["sizes"][:r])
    examples = slice(start, start + g["sizes"][r])
    offset, count = layout(kind, n)[r]
    rows = slice(offset, offset + count)
    return examples, rows, offset


def reference(g, bias):
    """One process, the global batch: losses and gradients of sum(weights * losses)."""
    hidden, table = tf.constant(g["hidden"]), tf.constant(g["table"])
    b = tf.constant(g["bias"]) if bias else None
    with tf.GradientTape() as tape:
        tape.watch([hidden, table] + ([b] if bias else []))
        logits = tf.matmul(hidden, table, transpose_b=True) + (b if bias else 0.0)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(g["targets"], logits)
        total = tf.reduce_sum(losses * g["weights"])
    grads = tape.gradient(total, [hidden, table] + ([b] if bias else []))
    return losses.numpy(), [x.numpy() for x in grads]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kind, chunk", diagonal(KINDS, [5, 12, 64]))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_loss_and_gradients_equal_one_process(hvd, graph, kind, chunk, bias):
    g = global_data(comm.size(), uneven=kind != "even")  # a rank without rows, uneven too
    examples, rows, offset = mine(g, kind)
    hidden = tf.constant(g["hidden"][examples])
    table = tf.Variable(g["table"][rows])
    b = tf.Variable(g["bias"][rows]) if bias else None
    sources = [hidden, table] + ([b] if bias else [])

    def step():
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            losses = sharded_softmax_cross_entropy(
                hidden,
                g["targets"][examples],
                table,
                offset,
                ROWS,
                bias_rows=b,
                chunk_rows=chunk,
                name="vp_test",
            )
            total = tf.reduce_sum(losses * g["weights"][examples])
        return losses, tape.gradient(total, sources)

    losses, grads = (tf.function(step) if graph else step)()
    want, want_grads = reference(g, bias)
    np.testing.assert_allclose(losses.numpy(), want[examples], atol=1e-5)
    # raw gradients, before any Horovod scaling: d hidden of this rank's examples, and d of
    # this rank's rows summed over every rank's examples
    np.testing.assert_allclose(grads[0].numpy(), want_grads[0][examples], atol=1e-5)
    np.testing.assert_allclose(
        tf.convert_to_tensor(grads[1]).numpy(), want_grads[1][rows], atol=1e-5
    )
    if bias:
        np.testing.assert_allclose(
            tf.convert_to_tensor(grads[2]).numpy(), want_grads[2][rows], atol=1e-5
        )


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kind", ["even", "last_rank_only"])
def test_horovod_tape_gives_one_process_mean_loss_gradients(hvd, graph, kind):
    """The repository's convention: each rank's loss is the mean over its batch, the table
    and bias are local variables (gradient divided by N, never allreduced), the dense
    weights feeding the hidden states are averaged. All equal one process's gradients of
    the mean loss over the global batch."""
    from merlin_models_de.merlin.training import DistributedGradientTape

    n = comm.size()
    g = global_data(n, seed=4)
    examples, rows, offset = mine(g, kind)
    rng = np.random.default_rng(9)
    features = rng.normal(size=(len(g["targets"]), 3)).astype(np.float32)
    dense = rng.normal(size=(3, DIM)).astype(np.float32)
    weights = tf.Variable(dense)
    table, b = tf.Variable(g["table"][rows]), tf.Variable(g["bias"][rows])
    for var in (table, b):
        mark_local(var)

    def step():
        with tf.GradientTape() as tape:
            hidden = tf.matmul(features[examples], weights)
            loss = tf.reduce_mean(
                sharded_softmax_cross_entropy(
                    hidden,
                    g["targets"][examples],
                    table,
                    offset,
                    ROWS,
                    bias_rows=b,
                    chunk_rows=5,
                    name="vp_tape",
                )
            )
        tape = DistributedGradientTape(tape, [table, b])
        return tape.gradient(loss, [weights, table, b])

    grads = [tf.convert_to_tensor(x).numpy() for x in (tf.function(step) if graph else step)()]
    full_w, full_table, full_b = tf.Variable(dense), tf.Variable(g["table"]), tf.Variable(g["bias"])
    with tf.GradientTape() as tape:
        logits = tf.matmul(tf.matmul(features, full_w), full_table, transpose_b=True) + full_b
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(g["targets"], logits))
    want = [x.numpy() for x in tape.gradient(loss, [full_w, full_table, full_b])]
    np.testing.assert_allclose(grads[0], want[0], atol=1e-5)
    np.testing.assert_allclose(grads[1], want[1][rows], atol=1e-5)
    np.testing.assert_allclose(grads[2], want[2][rows], atol=1e-5)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kind, chunk", diagonal(KINDS, [3, 12, 64]))
@pytest.mark.parametrize("integer", [False, True], ids=["normal", "ties"])
def test_top_k_equals_one_process(hvd, graph, kind, chunk, integer):
    g = global_data(comm.size(), uneven=kind != "even", seed=2, integer=integer)
    examples, rows, offset = mine(g, kind)
    k = 7

    def top():
        return sharded_top_k(
            tf.constant(g["hidden"][examples]),
            k,
            tf.constant(g["table"][rows]),
            offset,
            bias_rows=None if integer else tf.constant(g["bias"][rows]),
            chunk_rows=chunk,
            num_rows=ROWS,
            name="vp_top",
        )

    scores, ids = (tf.function(top) if graph else top)()
    logits = g["hidden"] @ g["table"].T + (0 if integer else g["bias"])
    want_scores, want_ids = tf.math.top_k(tf.constant(logits), k)
    np.testing.assert_array_equal(ids.numpy(), want_ids.numpy()[examples])
    np.testing.assert_allclose(scores.numpy(), want_scores.numpy()[examples], atol=1e-5)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kind", ["even", "last_rank_only", "reversed"])
def test_full_logits_equal_one_process(hvd, graph, kind):
    """predict's logits: each rank its own examples' scores over the whole catalog, in item
    order, from ranks holding uneven, empty or reversed row ranges and batches."""
    g = global_data(comm.size(), uneven=kind != "even", seed=3)
    examples, rows, offset = mine(g, kind)

    def logits():
        return sharded_logits(
            tf.constant(g["hidden"][examples]),
            tf.constant(g["table"][rows]),
            offset,
            num_rows=ROWS,
            name="vp_logits",
        )

    got = (tf.function(logits) if graph else logits)().numpy()
    want = (g["hidden"] @ g["table"].T)[examples]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def in_step():
    """Every rank reaches the same next collective (nobody was left waiting)."""
    got = comm.allgather(tf.constant([comm.rank()]), name="vp_after_error").numpy()
    np.testing.assert_array_equal(got, np.arange(comm.size()))


def expect_error_everywhere(match, fn):
    with pytest.raises(tf.errors.InvalidArgumentError, match="(?s)" + match):
        fn()
    in_step()


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_bad_target_on_one_rank_fails_every_rank(hvd, graph):
    n = comm.size()
    g = global_data(n)
    examples, rows, offset = mine(g, "even")
    targets = g["targets"][examples].copy()
    if comm.rank() == n - 1:
        targets[1] = ROWS + 100

    def call():
        return sharded_softmax_cross_entropy(
            g["hidden"][examples],
            targets,
            tf.constant(g["table"][rows]),
            offset,
            ROWS,
            name="vp_bad",
        )

    # every rank names the id, the rank holding it and the example (eager and a graph's
    # Assert format the values differently: match the numbers only)
    expect_error_everywhere(
        r"\D+".join(
            [
                # a graph's Assert prints strings C-escaped: \'vp_bad\'
                r"\\?'vp_bad\\?': target ids must lie in the catalog[^\n]*example:",
                str(ROWS),
                str(ROWS + 100),
                str(n - 1),
                r"1\b",
            ]
        ),
        tf.function(call) if graph else call,
    )


def test_a_column_slice_on_one_rank_fails_every_rank(hvd):
    g = global_data(comm.size())
    examples, rows, offset = mine(g, "even")
    table = g["table"][rows]
    if comm.rank() == 1:
        table = table[:, :2]
    expect_error_everywhere(
        r"as wide as the hidden states \(column-sliced.*\n1\n2\n4",
        lambda: sharded_softmax_cross_entropy(
            g["hidden"][examples], g["targets"][examples], table, offset, ROWS, name="vp_cols"
        ),
    )


def test_ranges_that_do_not_tile_the_catalog_fail_every_rank(hvd):
    g = global_data(comm.size())
    examples, _, _ = mine(g, "even")
    # every rank claims rows [0, 12): they overlap and leave the rest uncovered
    expect_error_everywhere(
        r"ranges must tile the catalog.*rank:\D+23\D+0\D+12\D+0\D+12\b",
        lambda: sharded_softmax_cross_entropy(
            g["hidden"][examples], g["targets"][examples], g["table"][:12], 0, ROWS, name="vp_tile"
        ),
    )
    expect_error_everywhere(
        r"sharded_top_k 'vp_topk_bad'.*k must be at most the catalog size",
        lambda: sharded_top_k(
            g["hidden"][examples],
            ROWS + 1,
            g["table"][mine(g, "even")[1]],
            mine(g, "even")[2],
            name="vp_topk_bad",
        ),
    )
