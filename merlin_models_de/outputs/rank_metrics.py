"""Merlin's top-k metrics of a vocab-parallel output, from each target's rank among all items.

A vocab-parallel output (:mod:`.tied`) gives Keras each example's loss as its prediction and
the target's rank among all items (:func:`.target_rank.sharded_target_rank`) as its target:
no rank holds the logits Merlin's ``TopkMetric`` sorts. :class:`TargetRankMetrics` computes
the same values from the rank. With one target per example Merlin's metrics at cutoff k
reduce to: recall = hit, precision = hit / k, MRR = average precision = hit / (rank + 1),
NDCG = hit / log2(rank + 2), each the (sample-weighted) mean over examples.

Each update sums the batch's values over ranks, so every rank's result (``fit``'s history,
``evaluate``'s) is the mean over the global batches, as one process computes it; summing the
states once more (``evaluate`` sums every metric's state over ranks) keeps their ratio.
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm

KINDS = ("recall", "mrr", "ndcg", "map", "precision")


def top_k_metric_values(ranks, k: int) -> dict:
    """Per-example values of Merlin's default top-k metrics at cutoff ``k`` (keys
    ``<kind>_at_<k>``), from the target's 0-based rank (``ranks >= k``: not in the top k)."""
    hit = tf.cast(ranks < k, tf.float32)
    position = tf.cast(ranks, tf.float32) + 1.0
    reciprocal = hit / position
    return {
        f"recall_at_{k}": hit,
        f"mrr_at_{k}": reciprocal,
        f"ndcg_at_{k}": hit * tf.math.log(2.0) / tf.math.log(position + 1.0),
        f"map_at_{k}": reciprocal,
        f"precision_at_{k}": hit / float(k),
    }


def default_entries(cutoffs) -> list:
    """``[kind, k, name]`` of Merlin's default metrics (its ``default_metrics(top_ks)``)."""
    return [[kind, int(k), f"{kind}_at_{int(k)}"] for k in cutoffs for kind in KINDS]


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class TargetRankMetrics(tf.keras.metrics.Metric):
    """Top-k metrics (a dict of results, as Merlin's ``TopKMetricsAggregator``) from the
    targets' ranks that a vocab-parallel output passes Keras as its targets.

    Args:
        entries: ``[kind, k, name]`` per metric (``kind`` one of ``KINDS``); None: the
            output's own cutoffs, filled in by ``compile`` (the output's default metrics).
    """

    def __init__(self, entries=None, name="top_k_from_ranks", **kwargs):
        super().__init__(name=name, **kwargs)
        self.entries = (
            None if entries is None else [[str(a), int(b), str(c)] for a, b, c in entries]
        )
        size = len(self.entries or ())
        self.totals = self.add_weight("totals", shape=[size], initializer="zeros")
        self.count = self.add_weight("count", shape=[], initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if self.entries is None:
            raise ValueError(
                "TargetRankMetrics(entries=None) stands for a tied output's default top-k "
                "metrics, which compile fills in; it cannot be updated itself. Received: "
                "entries=None"
            )
        ranks = tf.reshape(tf.cast(y_true, tf.int32), [-1])
        weight = tf.ones(tf.shape(ranks), tf.float32)
        if sample_weight is not None:
            weight *= tf.reshape(tf.cast(sample_weight, tf.float32), [-1])
        sums = [
            tf.reduce_sum(weight * top_k_metric_values(ranks, k)[f"{kind}_at_{k}"])
            for kind, k, _ in self.entries
        ]
        local = tf.stack(sums + [tf.reduce_sum(weight)])
        # a fixed name (comm.allreduce ignores name scopes): Keras updates metrics inside a
        # tf.cond numbered within each rank's own graph, and ranks holding different shards
        # trace different graphs
        summed = comm.allreduce(comm.after(local, y_pred), op="sum", name=f"mmde_{self.name}")
        return tf.group(self.totals.assign_add(summed[:-1]), self.count.assign_add(summed[-1]))

    def result(self):
        return {
            name: tf.math.divide_no_nan(self.totals[i], self.count)
            for i, (_, _, name) in enumerate(self.entries or ())
        }

    def reset_state(self):
        self.totals.assign(tf.zeros_like(self.totals))
        self.count.assign(0.0)

    def get_config(self):
        return dict(super().get_config(), entries=self.entries)


def output_default_metrics():
    """The default metrics of a vocab-parallel tied output: its top-k metrics at its own
    cutoffs (``top_k``), which ``compile`` fills in (a Merlin ``default_metrics_fn`` takes
    no arguments)."""
    return [TargetRankMetrics(None)]


__all__ = [
    "KINDS",
    "TargetRankMetrics",
    "default_entries",
    "output_default_metrics",
    "top_k_metric_values",
]
