"""What ``compile`` gives a vocab-parallel tied output: Merlin's loss and top-k metrics, in
the form the output can compute.

A vocab-parallel output (:mod:`.tied`) never forms the ``[batch, catalog]`` logits: it hands
Keras each example's softmax cross-entropy as its prediction and each target's rank among
all items as its target. Merlin's transformer examples compile such a model with
``loss="categorical_crossentropy"`` and
``metrics=mm.TopKMetricsAggregator.default_metrics(top_ks=[10])``; given those objects as
they are, Keras would take a cross-entropy of the losses and sort them as if they were
logits (a loss of 0.0 and metrics of 0.0, silently). So, per vocab-parallel output:

- loss: the categorical cross-entropy from logits (Merlin's or Keras', by name or instance,
  no label smoothing) becomes :class:`~.tied.TiedSoftmaxLoss`, the mean of the losses the
  output computed: the same loss, over the whole catalog;
- metrics: Merlin's top-k metrics (``RecallAt``, ``MRRAt``, ``NDCGAt``, ``AvgPrecisionAt``,
  ``PrecisionAt``, alone or in a ``TopKMetricsAggregator``) become one
  :class:`~.rank_metrics.TargetRankMetrics` with their names and cutoffs; Merlin's default
  (left unset) becomes the output's default cutoffs (``top_k``);
- anything else is refused with a ``ValueError`` naming the output's table, the argument and
  the value, raised by ``compile`` on every rank (the model is the same everywhere) before
  any step.

:func:`tied_compile_arguments` runs inside Keras' ``compile`` (installed by
:mod:`merlin_models_de.merlin.hooks`), after Merlin's ``compile`` parsed its arguments into
one entry per output.
"""

from __future__ import annotations

import tensorflow as tf
from merlin.models.tf.metrics.topk import (
    AvgPrecisionAt,
    MRRAt,
    NDCGAt,
    PrecisionAt,
    RecallAt,
    TopkMetric,
    TopKMetricsAggregator,
)

from merlin_models_de.outputs.rank_metrics import TargetRankMetrics, default_entries
from merlin_models_de.outputs.tied import TiedSoftmaxLoss, TiedTablePrediction

_KIND_OF = {
    RecallAt: "recall",
    MRRAt: "mrr",
    NDCGAt: "ndcg",
    AvgPrecisionAt: "map",
    PrecisionAt: "precision",
}
_CROSS_ENTROPIES = (
    tf.keras.losses.CategoricalCrossentropy,
    tf.keras.losses.SparseCategoricalCrossentropy,
)
_ARGUMENTS = ("loss", "metrics", "weighted_metrics")


def _vocab_parallel_outputs(model) -> dict:
    """``{key: tied layer}`` of the model's outputs that are vocab-parallel, under both names
    Merlin keys its parsed arguments by (``full_name`` for metrics, ``name`` for losses)."""
    found = {}
    for output in getattr(model, "model_outputs", None) or ():
        tied = getattr(output, "to_call", None)
        if isinstance(tied, TiedTablePrediction) and tied.vocab_parallel:
            found[output.full_name] = found[output.name] = tied
    return found


def _refusal(tied, argument, value, what) -> ValueError:
    return ValueError(
        f"The CategoricalOutput tied to table '{tied.table.name}' computes its softmax over "
        f"the sharded catalog itself (vocab-parallel); compile's {argument} {what}. "
        f"Received: {argument}={value!r}"
    )


def _loss(tied, loss):
    if loss is None or isinstance(loss, TiedSoftmaxLoss):
        return loss
    if isinstance(loss, _CROSS_ENTROPIES):
        config = loss.get_config()
        if config.get("from_logits") and not config.get("label_smoothing"):
            return TiedSoftmaxLoss(reduction=loss.reduction)
    raise _refusal(
        tied,
        "loss",
        loss,
        "can only be that loss: leave it unset or pass 'categorical_crossentropy' "
        "(from logits, no label smoothing)",
    )


def _top_k_entries(tied, metric, argument) -> list:
    """``[kind, k, name]`` of one metric given to compile (a Merlin top-k metric, an
    aggregator of them, or the output's default)."""
    if isinstance(metric, TargetRankMetrics):
        return default_entries(tied.top_k) if metric.entries is None else metric.entries
    if isinstance(metric, TopKMetricsAggregator):
        prefix = "weighted_" if metric.name.startswith("weighted_") else ""  # Merlin's naming
        parts = [_top_k_entries(tied, m, argument) for m in metric.topk_metrics]
        return [[kind, k, prefix + name] for part in parts for kind, k, name in part]
    kind = _KIND_OF.get(type(metric))
    if kind is None or not isinstance(metric, TopkMetric):  # a subclass may compute otherwise
        raise _refusal(
            tied,
            argument,
            metric,
            "can only hold Merlin's top-k metrics (RecallAt, MRRAt, NDCGAt, AvgPrecisionAt, "
            "PrecisionAt, TopKMetricsAggregator), computed from each target's rank: leave "
            "them unset (Merlin's default top-k metrics) or pass those",
        )
    return [[kind, int(metric.k), metric.name]]


def _metrics(tied, metrics, argument, index):
    if metrics is None:
        return None
    given = metrics if isinstance(metrics, (list, tuple)) else [metrics]
    entries = [e for metric in given for e in _top_k_entries(tied, metric, argument)]
    if not entries:
        return []
    if not tied.top_k:
        raise _refusal(
            tied,
            argument,
            list(given),
            "asks for top-k metrics, but the output was built with top_k=() (no ranking "
            "pass): build it with top_k=(10,) or leave the metrics out",
        )
    suffix = f"_{index}" if index else ""
    prefix = "weighted_" if argument == "weighted_metrics" else ""
    return [TargetRankMetrics(entries, name=f"{prefix}top_k_from_ranks{suffix}")]


def tied_compile_arguments(model, arguments: dict) -> dict:
    """The ``loss`` / ``metrics`` / ``weighted_metrics`` of a ``compile`` call (``arguments``,
    as Merlin hands them to Keras: dicts keyed by output), with every vocab-parallel output's
    entries in the form it computes; the other entries and models unchanged."""
    tied_outputs = _vocab_parallel_outputs(model)
    if not tied_outputs:
        return arguments
    out = dict(arguments)
    for argument in _ARGUMENTS:
        given = arguments.get(argument)
        if not isinstance(given, dict):  # not parsed by Merlin: a plain Keras model's
            continue
        changed = dict(given)
        for index, key in enumerate(sorted(k for k in given if k in tied_outputs)):
            tied = tied_outputs[key]
            if argument == "loss":
                changed[key] = _loss(tied, given[key])
            else:
                changed[key] = _metrics(tied, given[key], argument, index)
        out[argument] = changed
    return out


__all__ = ["tied_compile_arguments"]
