"""Top-k metrics from the targets' ranks (outputs/rank_metrics.py) on real Horovod ranks: the
update sums over ranks from inside a ``tf.cond`` (where Keras updates metrics) of graphs that
differ per rank, as they do when the ranks hold different shards."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.outputs.rank_metrics import TargetRankMetrics, default_entries


def test_an_update_inside_a_cond_of_graphs_unlike_per_rank_sums_over_ranks(hvd):
    n, r = comm.size(), comm.rank()
    metric = TargetRankMetrics(default_entries([2]))
    ranks = tf.constant([r, 5], tf.int32)  # rank r's examples: the targets' 0-based ranks

    @tf.function
    def step(flag):
        x = tf.constant(0.0)
        for _ in range(3 * r):  # each rank traces its own number of ops before the update
            x = tf.cond(flag, lambda x=x: x + 1.0, lambda x=x: x)

        def update():
            with tf.control_dependencies([metric.update_state(ranks, tf.zeros([2]))]):
                return tf.constant(1.0)

        return tf.cond(flag, update, lambda: tf.constant(0.0)) + x

    step(tf.constant(True))
    got = {k: float(v) for k, v in metric.result().items()}
    hits = sum(1.0 for k in range(n) if k < 2)  # one target of rank k sits at rank k, one at 5
    assert got["recall_at_2"] == pytest.approx(hits / (2 * n))
    assert got["mrr_at_2"] == pytest.approx(sum(1.0 / (k + 1) for k in range(min(n, 2))) / (2 * n))
    assert got["precision_at_2"] == pytest.approx(hits / (2 * n * 2))
    # every rank the same sums: the global batch's
    np.testing.assert_allclose(metric.count.numpy(), 2.0 * n)
