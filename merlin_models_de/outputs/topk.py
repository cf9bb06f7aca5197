"""Top-k retrieval over a table of a ``DistributedEmbeddings`` block, sharded or not.

:class:`ShardedTopK` is a Merlin ``TopKLayer``: where Merlin's ``BruteForce`` holds a copy
of every candidate vector, it scores the query against the table in place. Each rank scores
the global batch of queries against its own rows, in chunks, and keeps a running top-k; the
N·k candidates are merged on each query's rank
(:func:`merlin_models_de.outputs.vocab_parallel.sharded_top_k`). No rank holds the catalog or the
``[batch, catalog]`` scores; the result equals ``tf.math.top_k`` of one process's full
scores (ties to the lower item id). Collective: every rank calls it, each with its queries.

Use it wherever Merlin takes a top-k layer:

- ``mm.TopKOutput(to_call=ShardedTopK(block["item_id"], k=20))``, or
  ``mm.TopKEncoder(query_encoder, topk_layer=ShardedTopK(...))``;
- :func:`top_k_model` turns a trained next-item model (tied ``CategoricalOutput``) into one
  that predicts ``(scores, item ids)``, its output bias included;
- ``RetrievalModelV2.to_top_k_encoder()`` of a model whose output is tied to a block's table
  (``YoutubeDNNRetrievalModelV2``) uses it (installed by :mod:`merlin_models_de.merlin.hooks`).

Example:
    >>> topk = top_k_model(model, k=10)  # doctest: +SKIP
    >>> scores, ids = topk.predict(loader)  # each rank: its own queries  # doctest: +SKIP
"""

from __future__ import annotations

import merlin.models.tf as mm
import tensorflow as tf
from merlin.models.tf.core.prediction import Prediction, TopKPrediction
from merlin.models.tf.outputs.topk import TopKLayer
from merlin.models.tf.utils.tf_utils import call_layer

from merlin_models_de.block.handles import TableHandle, table_named
from merlin_models_de.outputs.bias import bias_rows
from merlin_models_de.outputs.vocab_parallel import DEFAULT_CHUNK_ROWS, sharded_top_k


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class ShardedTopK(TopKLayer):
    """Top-k items of ``query @ table^T (+ bias)`` over a block's table, where it lies.

    Args:
        table: a table handle (``block["item_id"]``) or a table name (bound within
            :func:`~merlin_models_de.block.handles.named_tables`, as when loading).
        k: items per query (Merlin's ``TopKLayer`` ``k``).
        bias_table: a per-item bias table laid out like ``table`` (the tied output's
            ``use_bias``; see :mod:`merlin_models_de.outputs.bias`): its handle or name, or None.
        chunk_rows: table rows scored at a time.
    """

    def __init__(
        self,
        table,
        k: int = 10,
        bias_table: str | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        **kwargs,
    ):
        super().__init__(k=k, **kwargs)
        table = table_named(table) if isinstance(table, str) else table
        if not isinstance(table, TableHandle):
            raise TypeError(
                "ShardedTopK takes a table of a DistributedEmbeddings block "
                f"(block['item_id']). Received: {type(table).__name__}"
            )
        table.check_whole_rows()
        if int(k) < 1:
            raise ValueError(f"ShardedTopK needs k >= 1. Received: k={k!r}")
        object.__setattr__(self, "table", table)  # untracked: its block owns it
        if isinstance(bias_table, str):  # by name: within named_tables (loading)
            bias_table = table_named(bias_table)
        object.__setattr__(self, "bias", bias_table)
        self.bias_table = bias_table.name if bias_table is not None else None
        self.chunk_rows = int(chunk_rows)

    @classmethod
    def from_output(cls, output, k: int = 10, **kwargs) -> "ShardedTopK":
        """The top-k layer of a tied output (a ``TiedTablePrediction`` or a Merlin output
        whose ``to_call`` is one): its table and bias."""
        tied = getattr(output, "to_call", output)
        if not hasattr(tied, "bias_block") or not isinstance(
            getattr(tied, "table", None), TableHandle
        ):
            raise TypeError(
                "from_output takes an output tied to a DistributedEmbeddings "
                f"table. Received: {type(output).__name__}"
            )
        block = tied.bias_block  # its own bias, bound by object
        bias = block[block.tables[0].name] if block is not None else None
        return cls(tied.table, k=k, bias_table=bias, chunk_rows=tied.chunk_rows, **kwargs)

    def index(self, candidates, identifiers=None):
        raise NotImplementedError(
            f"ShardedTopK scores table '{self.table.name}' where it lies; it takes no "
            "candidate index (use Merlin's BruteForce for a candidate tensor)."
        )

    def call(self, inputs, targets=None, testing=False, k=None, **kwargs):
        del kwargs
        k = min(int(k if k is not None else self._k), self.table.input_dim)
        if isinstance(inputs, tf.RaggedTensor):  # as Merlin's BruteForce: the last position
            inputs = tf.squeeze(inputs.to_tensor(), axis=1)
        rows, offset = self.table.local_rows()
        bias = bias_rows(self.bias.block)[0] if self.bias is not None else None
        scores, ids = sharded_top_k(
            inputs,
            k,
            rows,
            offset,
            bias_rows=bias,
            chunk_rows=self.chunk_rows,
            num_rows=self.table.input_dim,
            name=f"mmde_top_k_{self.table.name}",
        )
        ids = tf.cast(ids, tf.int32)  # Merlin's top-k ids are int32
        if not testing:
            return TopKPrediction(scores, ids)
        if targets is None:
            raise ValueError(
                f"ShardedTopK over table '{self.table.name}' needs targets in "
                "evaluate. Received: targets=None"
            )
        if isinstance(targets, tf.RaggedTensor):
            targets = targets.to_tensor()
        targets = tf.reshape(tf.cast(targets, tf.int32), [-1, 1])
        return Prediction(scores, tf.cast(tf.equal(targets, ids), scores.dtype))

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([input_shape[0], self._k]), tf.TensorShape([input_shape[0], self._k])

    def get_config(self):
        return dict(
            super().get_config(),
            table=self.table.name,
            bias_table=self.bias_table,
            chunk_rows=self.chunk_rows,
        )


def sharded_top_k_layer(output, k: int = 10):
    """A :class:`ShardedTopK` for a Merlin output tied to a table no rank holds whole, else
    None (``to_top_k_encoder``'s hook: Merlin's own path reads the whole table)."""
    tied = getattr(output, "to_call", None)
    table = getattr(tied, "table", None)
    if isinstance(table, TableHandle) and hasattr(tied, "bias_block") and table.sharded:
        return ShardedTopK.from_output(tied, k=k)
    return None


class _TrainedBlocks(tf.keras.layers.Layer):
    """Already-built blocks of a trained model, called in turn. ``mm.Model.build`` calls
    ``build`` on every block, built or not, and a Keras layer's ``build`` makes new
    variables: the trained weights would be replaced by fresh ones (in both models)."""

    def __init__(self, blocks, **kwargs):
        super().__init__(**kwargs)
        self.blocks = list(blocks)

    def build(self, input_shape=None):
        self.built = True  # the blocks are trained: never rebuilt

    def call(self, inputs, **kwargs):
        for block in self.blocks:
            inputs = call_layer(block, inputs, **kwargs)
        return inputs

    def compute_output_shape(self, input_shape):
        for block in self.blocks:
            input_shape = block.compute_output_shape(input_shape)
        return input_shape


def top_k_model(model, k: int = 10) -> "mm.Model":
    """A model predicting ``TopKPrediction(scores, ids)`` (and, in ``evaluate``, Merlin's
    top-k metrics) from a trained model whose last block is an output tied to a
    ``DistributedEmbeddings`` table: the same blocks (shared weights, left as trained), then
    a ``TopKOutput`` over :class:`ShardedTopK` of that output's table and bias."""
    *body, output = model.blocks
    layer = ShardedTopK.from_output(output, k=k)
    return mm.Model(
        _TrainedBlocks(body, name="trained_blocks"),
        mm.TopKOutput(to_call=layer, k=k, target=output.target),
    )


__all__ = ["ShardedTopK", "sharded_top_k_layer", "top_k_model"]
