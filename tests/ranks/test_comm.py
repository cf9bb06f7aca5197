"""The comm layer on real Horovod ranks (Gloo on CPU)."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm


def test_world_matches_the_launcher(hvd):
    import os

    assert comm.size() == int(os.environ["HOROVOD_SIZE"])
    assert comm.rank() == int(os.environ["HOROVOD_RANK"])


def test_alltoall_with_uneven_splits_and_its_gradient(hvd):
    n, r = comm.size(), comm.rank()
    # rank r sends (j + 1) rows to rank j, each row holding 100 * r + j
    splits = tf.constant([j + 1 for j in range(n)], tf.int32)
    x = tf.constant(
        np.concatenate([np.full((j + 1, 2), 100.0 * r + j) for j in range(n)]), tf.float32
    )
    with tf.GradientTape() as tape:
        tape.watch(x)
        got, received = comm.alltoall(x, splits)
        loss = tf.reduce_sum(got * tf.cast(tf.range(tf.shape(got)[0])[:, None] + 1, tf.float32))
    want = np.concatenate([np.full((r + 1, 2), 100.0 * src + r) for src in range(n)])
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(received.numpy(), [r + 1] * n)
    # the gradient travels back to the sender: each sent row gets the weight it had on arrival
    grad = tape.gradient(loss, x).numpy()
    assert grad.shape == x.shape and np.all(grad > 0)
    for j in range(n):
        # the j + 1 rows sent to rank j sat there at positions r * (j + 1) ... (weights p + 1)
        sent = sum(k + 1 for k in range(j))
        start = r * (j + 1)
        np.testing.assert_array_equal(
            grad[sent : sent + j + 1, 0], np.arange(start + 1, start + j + 2, dtype=np.float32)
        )


def test_allgather_allreduce_broadcast(hvd):
    n, r = comm.size(), comm.rank()
    gathered = comm.allgather(tf.fill([r + 1], float(r))).numpy()
    np.testing.assert_array_equal(
        gathered, np.concatenate([[float(k)] * (k + 1) for k in range(n)])
    )
    assert comm.allreduce(tf.constant(float(r)), op="sum").numpy() == sum(range(n))
    assert comm.broadcast(tf.constant(r + 7), root_rank=1).numpy() == 8
    assert comm.allgather_object({"rank": r}) == [{"rank": k} for k in range(n)]
    assert comm.broadcast_object(f"from {r}", root_rank=0) == "from 0"
    comm.barrier()


def test_average_gradients_groups_by_dtype_keeps_none_and_densifies_slices(hvd):
    """Mixed dtypes (a float64 layer next to float32 ones), a missing gradient and an
    IndexedSlices gradient, eagerly and in a graph: each averaged over ranks, in place."""
    n, r = comm.size(), comm.rank()
    mean_rank = (n - 1) / 2

    def grads():
        return [
            tf.constant([1.0, 2.0]) * (r + 1),
            None,
            tf.constant([[3.0]], tf.float64) * (r + 1),
            tf.IndexedSlices(tf.constant([[r + 1.0, 1.0]]), tf.constant([r]), tf.constant([n, 2])),
        ]

    for run in (
        lambda: comm.average_gradients(grads()),
        tf.function(lambda: comm.average_gradients(grads(), prefix="graph_grad")),
    ):
        a, missing, b, c = run()
        assert missing is None
        np.testing.assert_allclose(a.numpy(), np.array([1.0, 2.0]) * (mean_rank + 1))
        assert b.dtype == tf.float64
        np.testing.assert_allclose(b.numpy(), [[3.0 * (mean_rank + 1)]])
        want = np.zeros((n, 2))
        for k in range(n):
            want[k] = [(k + 1.0) / n, 1.0 / n]
        np.testing.assert_allclose(c.numpy(), want)
    assert comm.average_gradients([None, None]) == [None, None]


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16, tf.float64])
def test_ids_ride_after_the_rows_bit_for_bit_and_the_rows_alone_get_a_gradient(hvd, dtype):
    """``backward.exchange`` with a payload (the next batch's ids, backends/horovod/ahead.py):
    each rank's blocks reach each rank in order, its int64 ids travel after them in rows'
    units, whatever their bits (NaN patterns, negatives); sizes differ by rank and
    destination, rank 0 sends rank 0 empty blocks, and each block gets its own gradient."""
    from merlin_models_de.backends.horovod import backward

    n, r = comm.size(), comm.rank()

    def sizes(src, dst):  # rank src sends rank dst two blocks: (j + r) and 2 (j + r) rows
        return [src + dst, 2 * (src + dst)]

    def block(src, dst, k):  # holding 10 src + dst + 100 k
        return np.full(sizes(src, dst)[k], 10.0 * src + dst + 100.0 * k)

    blocks = [[tf.cast(tf.constant(block(r, j, k)), dtype) for k in range(2)] for j in range(n)]

    def ids(src, dst):  # NaN bit patterns as floats of either width, signs alternating
        return [
            (0x7FF8000000000000 + 1000 * src + 10 * dst + k) * (-1) ** k
            for k in range(src + 2 * dst + 1)
        ]

    payload = tf.constant(sum((ids(r, j) for j in range(n)), []), tf.int64)
    payload_splits = tf.constant([r + 2 * j + 1 for j in range(n)], tf.int32)
    with tf.GradientTape() as tape:
        tape.watch(blocks)
        got, (arrived, arrived_splits) = backward.exchange(
            blocks,
            [tf.constant(sizes(r, j)) for j in range(n)],
            [tf.constant(sizes(src, r)) for src in range(n)],
            "carry_test",
            None,
            (payload, payload_splits),
        )
        loss = sum(
            tf.reduce_sum(tf.cast(b, tf.float32) * (2.0 + k))
            for source in got
            for k, b in enumerate(source)
        )
    for src in range(n):
        for k in range(2):
            np.testing.assert_array_equal(
                tf.cast(got[src][k], tf.float32).numpy(), block(src, r, k)
            )
    np.testing.assert_array_equal(arrived.numpy(), sum((ids(src, r) for src in range(n)), []))
    np.testing.assert_array_equal(arrived_splits.numpy(), [src + 2 * r + 1 for src in range(n)])
    for j, grads in enumerate(tape.gradient(loss, blocks)):
        for k, g in enumerate(grads):
            np.testing.assert_array_equal(
                tf.cast(g, tf.float32).numpy(), np.full(sizes(r, j)[k], 2.0 + k)
            )
