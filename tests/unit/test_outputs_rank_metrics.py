"""Top-k metrics from the targets' ranks (outputs/rank_metrics.py), in one process: each kind's
value by hand, weighted means over batches, and entries=None refused naming itself."""

import math

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.outputs.rank_metrics import (
    TargetRankMetrics,
    default_entries,
    top_k_metric_values,
)


def test_each_kind_from_the_targets_rank():
    values = {k: v.numpy() for k, v in top_k_metric_values(tf.constant([0, 2, 5]), 3).items()}
    np.testing.assert_allclose(values["recall_at_3"], [1, 1, 0])
    np.testing.assert_allclose(values["mrr_at_3"], [1, 1 / 3, 0])
    np.testing.assert_allclose(values["ndcg_at_3"], [1, math.log(2) / math.log(4), 0], rtol=1e-6)
    np.testing.assert_allclose(values["precision_at_3"], [1 / 3, 1 / 3, 0])
    assert values["map_at_3"].tolist() == values["mrr_at_3"].tolist()


def test_the_metric_is_a_weighted_mean_over_every_batch():
    metric = TargetRankMetrics(default_entries([1, 2]))
    metric.update_state(tf.constant([0, 1]), tf.zeros([2, 1]))
    metric.update_state(tf.constant([3]), tf.zeros([1, 1]), sample_weight=tf.constant([2.0]))
    result = {k: float(v) for k, v in metric.result().items()}
    assert result["recall_at_1"] == pytest.approx(1 / 4)  # (1 + 0 + 2 * 0) / 4
    assert result["recall_at_2"] == pytest.approx(2 / 4)
    assert result["mrr_at_2"] == pytest.approx((1 + 0.5) / 4)
    metric.reset_state()
    assert float(metric.result()["recall_at_1"]) == 0.0
    again = TargetRankMetrics.from_config(metric.get_config())
    assert again.entries == metric.entries


def test_the_placeholder_for_compile_cannot_be_updated():
    with pytest.raises(ValueError, match="Received: entries=None"):
        TargetRankMetrics(None).update_state(tf.constant([0]), tf.zeros([1, 1]))
