"""The report of ids that ``validate_ids=False`` let through.

Without validation an id outside its table is not an error: a row-sliced table reads a zero
row for it (docs/block.md). So that a user who turned validation off still sees bad ids, each
block counts them per feature (``DistributedEmbeddings.out_of_range_ids``) and the counts are
summed over ranks, rank 0 naming the features that had any:

- a Merlin model's ``fit`` adds :class:`OutOfRangeIdsReport` on several ranks: each epoch's
  count goes into the epoch's logs (``history.history["out_of_range_ids"]``, and
  ``"val_out_of_range_ids"`` for the validation data); its ``evaluate`` and ``predict`` add
  it too and rank 0 reports what they read;
- a plain Keras model passes ``OutOfRangeIdsReport(model)`` in ``callbacks`` of its ``fit`` /
  ``evaluate`` / ``predict`` (the same report);
- a custom loop calls :func:`out_of_range_ids` where it wants the count (an epoch's end):
  a collective, on every rank.

Example:
    >>> history = model.fit(loader, epochs=2)  # doctest: +SKIP
    >>> history.history["out_of_range_ids"]  # doctest: +SKIP
    [0, 12]
    >>> out_of_range_ids(model, "epoch 3")  # in a custom loop, on every rank  # doctest: +SKIP
    {'embeddings/item': 4}
"""

from __future__ import annotations

import sys

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.variables import embedding_blocks

LOG_KEY = "out_of_range_ids"


def unvalidated_blocks(model) -> list:
    """The blocks of ``model`` (a model, a layer, or a list of blocks) that skip id
    validation."""
    blocks = model if isinstance(model, (list, tuple)) else embedding_blocks(model)
    return [b for b in blocks if not b.validate_ids]


def _taken(blocks) -> dict:
    """This rank's counts since the last reading, ``{block/feature: count}``, reset."""
    counts = {}
    for block in blocks:
        for feature, count in (block.out_of_range_ids(reset=True) or {}).items():
            counts[f"{block.name}/{feature}"] = count
    return counts


def _added(first: dict, second: dict) -> dict:
    return {k: first.get(k, 0) + second.get(k, 0) for k in {**first, **second}}


def _summed(counts: dict, what: str) -> dict:
    """``counts`` summed over ranks (collective: every rank's keys are the same, in the same
    order, as every rank holds the same blocks); rank 0 names the features that had any."""
    names = sorted(counts)
    summed = (
        comm.allreduce(
            tf.constant([counts[n] for n in names] + [0], tf.int64),
            op="sum",
            name="mmde_out_of_range_ids",
        )
        .numpy()
        .tolist()[:-1]
    )
    total = dict(zip(names, summed))
    bad = {n: c for n, c in total.items() if c}
    if bad and comm.rank() == 0:
        print(
            f"merlin_models_de: {what}: {sum(bad.values())} ids outside their tables were "
            "looked up with validate_ids=False (row-sliced tables read zero rows for "
            f"them). Ids per feature: {bad}",
            file=sys.stderr,
            flush=True,
        )
    return total


def out_of_range_ids(model, what: str = "custom loop") -> dict:
    """Collective (every rank calls it at the same point): ``{block/feature: count}`` of the
    ids outside their tables that ``model``'s blocks with ``validate_ids=False`` looked up,
    over every rank, since the last reading (which this one resets); rank 0 names the
    features that had any, after ``what`` (e.g. ``"epoch 3"``). Empty when no block skips
    validation or in one process (there an id outside its table raises)."""
    return _summed(_taken(unvalidated_blocks(model)), what)


class OutOfRangeIdsReport(tf.keras.callbacks.Callback):
    """The ids outside their tables of ``fit`` (per epoch, training and validation apart),
    ``evaluate`` and ``predict``, over every rank (collective: every rank's call runs it at
    the same points). ``model``: the model, a layer, or a list of blocks."""

    def __init__(self, model):
        super().__init__()
        self.blocks = unvalidated_blocks(model)
        self._fitting, self._training, self._validation = False, {}, None

    def on_train_begin(self, logs=None):
        self._fitting = True

    def on_train_end(self, logs=None):
        self._fitting = False

    def on_epoch_begin(self, epoch, logs=None):
        _taken(self.blocks)
        self._training, self._validation = {}, None

    def on_test_begin(self, logs=None):
        taken = _taken(self.blocks)  # in fit: the epoch's training so far
        self._training = _added(self._training, taken) if self._fitting else {}

    def on_test_end(self, logs=None):
        if self._fitting:  # fit's validation: reported with the epoch
            self._validation = _taken(self.blocks)
        else:
            _summed(_taken(self.blocks), "evaluate")

    def on_predict_begin(self, logs=None):
        _taken(self.blocks)

    def on_predict_end(self, logs=None):
        _summed(_taken(self.blocks), "predict")

    def on_epoch_end(self, epoch, logs=None):
        training = _summed(_added(self._training, _taken(self.blocks)), f"epoch {epoch + 1}")
        if logs is not None:
            logs[LOG_KEY] = int(sum(training.values()))
        if self._validation is not None:
            validation = _summed(self._validation, f"epoch {epoch + 1} validation")
            if logs is not None:
                logs[f"val_{LOG_KEY}"] = int(sum(validation.values()))


def report_for(model) -> OutOfRangeIdsReport | None:
    """The report for ``model``'s blocks that skip id validation (they count the ids outside
    their tables once built, on several ranks), or None."""
    return OutOfRangeIdsReport(model) if unvalidated_blocks(model) else None


__all__ = ["LOG_KEY", "OutOfRangeIdsReport", "out_of_range_ids", "report_for"]
