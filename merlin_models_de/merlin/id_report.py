"""The epoch report of ids that ``validate_ids=False`` let through.

Without validation an id outside its table is not an error: a row-sliced table reads a zero
row for it (docs/block.md). So that a user who turned validation off still sees bad ids, each
block counts them per feature (``DistributedEmbeddings.out_of_range_ids``) and ``fit`` adds
this callback on several ranks: each epoch it sums the counts over ranks into the epoch's
logs (``history.history["out_of_range_ids"]``) and rank 0 names the features that had any.

Example:
    >>> history = model.fit(loader, epochs=2)  # doctest: +SKIP
    >>> history.history["out_of_range_ids"]  # doctest: +SKIP
    [0, 12]
"""
from __future__ import annotations

import sys

import tensorflow as tf

from merlin_models_de import comm

LOG_KEY = "out_of_range_ids"


class OutOfRangeIdsReport(tf.keras.callbacks.Callback):
    """Per epoch: the ids outside their tables, over every rank (collective: every rank's
    ``fit`` calls it at the same epoch ends)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = list(blocks)

    def on_epoch_begin(self, epoch, logs=None):
        for block in self.blocks:
            block.out_of_range_ids(reset=True)

    def on_epoch_end(self, epoch, logs=None):
        names, counts = [], []
        for block in self.blocks:
            for feature, count in (block.out_of_range_ids(reset=True) or {}).items():
                names.append(f"{block.name}/{feature}")
                counts.append(count)
        summed = comm.allreduce(tf.constant(counts + [0], tf.int64), op="sum",
                                name="mmde_out_of_range_ids").numpy().tolist()[:-1]
        if logs is not None:
            logs[LOG_KEY] = int(sum(summed))
        bad = {n: c for n, c in zip(names, summed) if c}
        if bad and comm.rank() == 0:
            print(f"merlin_models_de: epoch {epoch + 1}: {sum(bad.values())} ids outside their "
                  "tables were looked up with validate_ids=False (row-sliced tables read zero "
                  f"rows for them). Ids per feature: {bad}", file=sys.stderr, flush=True)


def report_for(model) -> OutOfRangeIdsReport | None:
    """The report for ``model``'s blocks that skip id validation (they count the ids outside
    their tables once built, on several ranks), or None."""
    from merlin_models_de.variables import embedding_blocks

    blocks = [b for b in embedding_blocks(model) if not b.validate_ids]
    return OutOfRangeIdsReport(blocks) if blocks else None
