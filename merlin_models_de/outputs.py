"""A weight-tied categorical output over a (possibly sharded) item table.

``CategoricalOutput(to_call=block["item_id"])`` is Merlin's ``mm.CategoricalOutput`` with the
item table of a ``DistributedEmbeddings`` block as its output layer (weight tying). Where
one rank holds the whole table (one process, or a data-parallel table) it *is* Merlin's
output: logits ``hidden @ table^T``, Merlin's default loss and top-k metrics.

Where the table is sharded (table-wise on one rank, or row-sliced), no rank can form the
``[batch, catalog]`` logits. In ``fit`` / ``evaluate`` the output then computes each
example's softmax cross-entropy itself, vocab-parallel
(:func:`merlin_models_de.vocab_parallel.sharded_softmax_cross_entropy`: every rank scores
the global batch against its own rows, in chunks), and hands Keras the ``[batch, 1]``
per-example losses as its "predictions"; its default loss, :class:`PerExampleLoss`, takes
their (sample-weighted) mean. Loss and gradients equal one process on the global batch.
Leave ``loss`` unset in ``compile`` (or pass ``PerExampleLoss()``): another loss would be
applied to the loss values. Not yet on a sharded table: top-k metrics (none by default),
``predict`` (raises), an output bias, ``logits_temperature`` other than 1, sequence
(3-D / ragged) hidden states. Not yet anywhere: saving and reloading a model with this
output (its config cannot name the block's table).

Example:
    >>> block = mm.DistributedEmbeddings(schema, dim=16)  # doctest: +SKIP
    >>> model = mm.Model(mm.InputBlockV2(schema, categorical=block), mm.MLPBlock([16]),
    ...                  CategoricalOutput(to_call=block["item_id"], target="next_item"))
    ... # doctest: +SKIP
"""
from __future__ import annotations

import merlin.models.tf as mm
import tensorflow as tf

from merlin_models_de.handles import TableHandle
from merlin_models_de.vocab_parallel import DEFAULT_CHUNK_ROWS, sharded_softmax_cross_entropy


def no_metrics():
    """Default metrics of a sharded tied output: none (top-k over shards is not there yet)."""
    return ()


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class PerExampleLoss(tf.keras.losses.Loss):
    """The loss of an output that computed its per-example losses itself: ``y_pred`` holds
    them (``[batch, 1]``), ``y_true`` is ignored; Keras applies sample weights and the mean."""

    def call(self, y_true, y_pred):
        del y_true
        return tf.reshape(y_pred, [-1])


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class TiedTablePrediction(tf.keras.layers.Layer):
    """Logits against a table handle, or (sharded table, training / evaluation) the
    per-example vocab-parallel losses as an ``mm.Prediction``.

    Owns no variables: the table belongs to its block.
    """

    def __init__(self, table: TableHandle, target: str | None = None, vocab_parallel=None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, **kwargs):
        super().__init__(**kwargs)
        object.__setattr__(self, "table", table)  # untracked: the block tracks the table
        self.target = target
        self.num_classes = table.input_dim
        self.vocab_parallel = table.sharded if vocab_parallel is None else bool(vocab_parallel)
        self.chunk_rows = chunk_rows
        if self.vocab_parallel:
            table.check_whole_rows()  # at construction, the same on every rank

    def build(self, input_shape=None):
        self.table.build(input_shape)
        super().build(input_shape)

    def call(self, inputs, targets=None, training=False, testing=False, **kwargs):
        name = self.table.name
        scoring = not (training or testing)
        if not self.vocab_parallel or (scoring and not self.table.sharded):
            return tf.matmul(inputs, self.table.embeddings, transpose_b=True)
        if scoring:
            raise ValueError(
                f"Table '{name}' is sharded across {self.table.block.world_size} ranks, so no "
                "rank can compute the output's full logits: predict / serving of the tied "
                "output are not supported on a sharded table yet (fit and evaluate are). "
                "Score in one process with the gathered table (block.get_global_weights()).")
        if isinstance(targets, dict):
            if self.target not in targets:
                raise ValueError(f"The tied output over table '{name}' needs the target "
                                 f"'{self.target}'. Received targets: {sorted(targets)}")
            targets = targets[self.target]
        if targets is None:
            raise ValueError(f"The tied output over table '{name}' needs targets (item ids) "
                             "in fit / evaluate. Received: targets=None")
        rows, offset = self.table.local_rows()
        losses = sharded_softmax_cross_entropy(
            inputs, targets, rows, offset, self.num_classes, chunk_rows=self.chunk_rows,
            name=f"mmde_tied_{name}")
        losses = losses[:, None]
        return mm.Prediction(losses, tf.zeros_like(losses))

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([input_shape[0], self.num_classes])

    def get_config(self):
        return dict(super().get_config(), target=self.target, chunk_rows=self.chunk_rows)


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class CategoricalOutput(mm.CategoricalOutput):
    """``mm.CategoricalOutput`` that also takes a ``DistributedEmbeddings`` table handle.

    Args:
        to_call: ``block["item_id"]`` of a ``DistributedEmbeddings`` block, or anything
            ``mm.CategoricalOutput`` takes (then this is exactly Merlin's output).
        vocab_parallel: None: when the table is sharded. True forces the vocab-parallel
            loss (also in one process, where it equals the full softmax); False never.
        chunk_rows: table rows scored at a time by the vocab-parallel loss.
        **kwargs: ``mm.CategoricalOutput``'s arguments (``target`` names the target column;
            the default is the first feature reading the table).
    """

    def __init__(self, to_call, vocab_parallel=None, chunk_rows=DEFAULT_CHUNK_ROWS, **kwargs):
        if isinstance(to_call, TableHandle):
            target = kwargs.pop("target", None) or kwargs.pop("target_name", None) or \
                to_call.col_schema.name
            to_call = TiedTablePrediction(to_call, target, vocab_parallel, chunk_rows)
            kwargs["target_name"] = target
            if to_call.vocab_parallel:
                if kwargs.get("logits_temperature", 1.0) != 1.0:
                    raise ValueError(
                        f"logits_temperature is not supported on the sharded table "
                        f"'{to_call.table.name}' yet. Received: "
                        f"logits_temperature={kwargs['logits_temperature']}")
                kwargs.setdefault("default_loss", PerExampleLoss())
                kwargs.setdefault("default_metrics_fn", no_metrics)
        super().__init__(to_call=to_call, **kwargs)


__all__ = ["CategoricalOutput", "PerExampleLoss", "TiedTablePrediction"]
