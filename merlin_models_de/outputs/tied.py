"""Weight-tied outputs over a (possibly sharded) table of a ``DistributedEmbeddings`` block.

Merlin's own ``mm.CategoricalOutput(to_call=block["item_id"])`` and
``mm.ContrastiveOutput(to_call=block["item_id"], ...)`` take a table handle of the block as
they take an ``mm.EmbeddingTable`` (weight tying; the handle becomes a
:class:`TiedTablePrediction`, see :func:`tie_to_handle`, installed into Merlin by
:mod:`merlin_models_de.compat`). Where one rank holds the whole table (one process, or a
data-parallel table) the output *is* Merlin's: logits ``hidden @ table^T`` (+ bias), Merlin's
loss and top-k metrics, sequences (ragged hidden states) included.

Where the table is sharded (table-wise on one rank, or row-sliced), no rank can form the
``[batch, catalog]`` logits:

- ``CategoricalOutput``: in ``fit`` / ``evaluate`` the output computes each example's softmax
  cross-entropy itself, vocab-parallel
  (:func:`merlin_models_de.outputs.vocab_parallel.sharded_softmax_cross_entropy`: every rank scores
  the global batch against its own rows, in chunks), and hands Keras the 1-D per-example
  losses as its "predictions"; its default loss, :class:`TiedSoftmaxLoss`, takes their
  (sample-weighted) mean (on 2-D logits it is Merlin's categorical cross-entropy, so a saved
  single-process copy trains right). Loss and gradients equal one process on the global
  batch. Sequence targets (``SequencePredictNext`` / ``Last`` / ``MaskRandom``): the hidden
  states and targets at the target positions, flattened; in training each rank's losses are
  weighted by its share of the global number of targets, so N ranks equal one process also
  when the ranks hold different numbers of targets. ``logits_temperature`` divides the
  hidden states (the logits ``hidden @ W^T / T``).
- ``ContrastiveOutput``: positives and sampled negatives are looked up through the block's
  distributed lookup (each rank its own ids), so sampled softmax trains as in one process.
- Top-k metrics: the output hands Keras, as the targets, each target's rank among all items
  (:func:`merlin_models_de.outputs.target_rank.sharded_target_rank`), and
  :class:`~merlin_models_de.outputs.rank_metrics.TargetRankMetrics` turns them into Merlin's
  top-k metrics, summed over ranks: ``fit`` and ``evaluate`` report them as one process does.
  ``compile`` (:func:`merlin_models_de.outputs.compiled.tied_compile_arguments`) takes
  Merlin's way of asking: ``loss="categorical_crossentropy"`` (the loss the output computes)
  and Merlin's top-k metrics (``TopKMetricsAggregator.default_metrics(top_ks=[10])``); left
  unset, the metrics are Merlin's defaults at the output's cutoffs (``top_k``).
- Scoring (``predict``, and the build call Merlin's ``fit`` makes) on a sharded table gives
  each rank its own examples' full logits (:func:`merlin_models_de.outputs.vocab_parallel.sharded_logits`:
  every rank scores the global batch against its rows; memory ``B_local x catalog``, what
  ``predict`` returns).
- ``use_bias=True`` (this package's ``CategoricalOutput``): one bias per item, sharded like
  the table (:mod:`merlin_models_de.outputs.bias`), in the loss, top-k and logits.

A saved model names the table in the output's config; loading binds it to the table of the
most recently constructed block that has one of that name (the loaded model's own block,
built before its output).

Example:
    >>> block = mm.DistributedEmbeddings(schema, dim=16)  # doctest: +SKIP
    >>> model = mm.Model(mm.InputBlockV2(schema, categorical=block), mm.MLPBlock([16]),
    ...                  mm.CategoricalOutput(to_call=block["item_id"], target="next_item"))
    ... # doctest: +SKIP
"""

from __future__ import annotations

import merlin.models.tf as mm
import tensorflow as tf
from merlin.models.tf.losses import CategoricalCrossEntropy
from merlin.schema import Schema

from merlin_models_de import comm
from merlin_models_de.block.handles import TableHandle, table_named
from merlin_models_de.outputs.bias import bias_rows, bias_table_name, item_bias_block
from merlin_models_de.outputs.rank_metrics import output_default_metrics
from merlin_models_de.outputs.target_rank import sharded_target_rank
from merlin_models_de.outputs.vocab_parallel import (
    DEFAULT_CHUNK_ROWS,
    sharded_logits,
    sharded_softmax_cross_entropy,
)

# the name saved configs of the output's default metrics may carry
no_metrics = output_default_metrics


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class TiedSoftmaxLoss(CategoricalCrossEntropy):
    """Merlin's categorical cross-entropy (from logits) on 2-D logits; on 1-D predictions,
    the per-example losses a vocab-parallel output computed itself (``y_true`` ignored;
    Keras applies sample weights and the mean)."""

    def call(self, y_true, y_pred):
        if y_pred.shape.rank == 1:
            return y_pred
        return super().call(y_true, y_pred)


class _ShardedRows:
    """``.embeddings`` of a sharded tied table: no rank has the matrix. Present (Merlin checks
    that the attribute exists), but any use as a tensor raises naming the table."""

    def __init__(self, table: TableHandle):
        self.table = table
        self.shape = tf.TensorShape([table.input_dim, table.dim])

    def message(self) -> str:
        block = self.table.block
        return (
            f"Table '{self.table.name}' is sharded across {block.world_size} ranks "
            f"({block.plan.kind_of(self.table.name).value}); its full matrix is on no rank. "
            "Use embedding_lookup(ids) for rows, or block.get_global_weights() "
            "(collective: every rank calls it) for a NumPy copy."
        )

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise AttributeError(f"{attribute}: {self.message()}")

    def __repr__(self):
        return f"<sharded table {self.table.name!r}: {self.message()}>"


def _refuse_as_tensor(value, dtype=None, name=None, as_ref=False):
    del dtype, name, as_ref
    raise ValueError(value.message())


tf.register_tensor_conversion_function(_ShardedRows, _refuse_as_tensor)


def _target_positions(hidden, targets):
    """Flattens sequence outputs as Merlin's loss sees them: the hidden states and targets at
    the target positions (the targets' mask where present), ``[n, d]`` and ``[n]``."""
    mask = getattr(targets, "_keras_mask", None)
    if isinstance(targets, tf.RaggedTensor) and mask is not None:
        mask = mask.with_row_splits_dtype(targets.row_splits.dtype)
        targets = tf.ragged.boolean_mask(targets, mask)
        if isinstance(hidden, tf.RaggedTensor) and hidden.shape.rank == 3:
            hidden_mask = mask.with_row_splits_dtype(hidden.row_splits.dtype)
            if getattr(hidden, "_keras_mask", None) is None:  # one state per position
                hidden = tf.ragged.boolean_mask(hidden, hidden_mask)
    if isinstance(hidden, tf.RaggedTensor):
        hidden = hidden.flat_values
    if isinstance(targets, tf.RaggedTensor):
        targets = targets.flat_values
    hidden = tf.convert_to_tensor(hidden)
    if hidden.shape.rank == 3:  # dense sequences: every position
        hidden = tf.reshape(hidden, [-1, hidden.shape[-1]])
    return hidden, tf.reshape(targets, [-1])


def _global_mean_share(losses, name):
    """This rank's per-example losses scaled by ``N * n_r / n`` (``n_r`` its examples, ``n``
    all ranks'), so that the ranks' averaged mean losses are the mean over all examples, as
    one process computes it, also when the ranks hold different numbers of targets
    (sequences). Training only: evaluate weights each rank's mean by its ``n_r`` itself."""
    n = comm.size()
    if n == 1:
        return losses
    mine = tf.cast(tf.size(losses), losses.dtype)
    total = comm.allreduce(comm.after(mine, losses), op="sum", name=name)
    return losses * tf.stop_gradient(n * mine / tf.maximum(total, 1.0))


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class TiedTablePrediction(tf.keras.layers.Layer):
    """Logits against a table handle (Merlin's ``EmbeddingTablePrediction`` for a block's
    table), or (sharded table, training / evaluation) the 1-D per-example vocab-parallel
    losses as an ``mm.Prediction``.

    Args:
        table: a :class:`~merlin_models_de.block.handles.TableHandle`, or a table name (bound within
            :func:`~merlin_models_de.block.handles.named_tables`; used by ``from_config``).
        target: the target column (vocab-parallel loss).
        vocab_parallel: None: when the table is sharded. True forces the vocab-parallel loss
            (also in one process, where it equals the full softmax); False never.
        chunk_rows: table rows scored at a time by the vocab-parallel loss.
        use_bias, bias_initializer: a bias per item, as Merlin's; sharded like the table
            (:mod:`merlin_models_de.outputs.bias`).
        logits_temperature: divides the logits (vocab-parallel path; the whole-table path
            leaves it to Merlin's output).
        top_k: cutoffs of the default top-k metrics (recall, MRR, NDCG, MAP, precision) of
            the vocab-parallel path (Merlin's default: 10); () for none: no ranking pass,
            and compile refuses top-k metrics.

    Owns no variables: the table belongs to its block, the bias to a block of its own.
    """

    def __init__(
        self,
        table,
        target: str | None = None,
        vocab_parallel=None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        use_bias: bool = False,
        bias_initializer="zeros",
        logits_temperature: float = 1.0,
        top_k=(10,),
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(table, str):
            table = table_named(table)
        object.__setattr__(self, "table", table)  # untracked: the block tracks the table
        self.target = target or table.col_schema.name
        self.num_classes = table.input_dim
        self.requested_vocab_parallel = vocab_parallel
        self.vocab_parallel = table.sharded if vocab_parallel is None else bool(vocab_parallel)
        self.chunk_rows = chunk_rows
        self.use_bias, self.bias_initializer = use_bias, bias_initializer
        self.logits_temperature = logits_temperature
        self.top_k = tuple(int(k) for k in (top_k or ()))
        if self.vocab_parallel:
            table.check_whole_rows()  # at construction, the same on every rank
        # the bias lies with the table's rows, in a block of its own (see outputs/bias.py)
        self.bias_block = item_bias_block(table, bias_initializer) if use_bias else None

    def build(self, input_shape=None):
        self.table.build(input_shape)
        if self.bias_block is not None:
            self.bias_block.build({})
        super().build(input_shape)

    def _bias_rows(self):
        """This rank's ``[R_local]`` bias (None without a bias)."""
        return bias_rows(self.bias_block)[0] if self.bias_block is not None else None

    @property
    def bias(self):
        """The whole ``[catalog]`` bias where one rank holds it (as Merlin's attribute)."""
        if self.table.sharded:
            return _ShardedRows(self.bias_block[bias_table_name(self.table.name)])
        return self._bias_rows()

    @property
    def embeddings(self):
        if self.table.sharded:
            return _ShardedRows(self.table)
        return self.table.embeddings

    def embedding_lookup(self, ids, **kwargs):
        """Rows of ``ids`` (collective where the table is sharded)."""
        del kwargs
        return self.table.embedding_lookup(ids)

    def logits(self, inputs):
        """``inputs @ table^T`` (+ bias); on a sharded table collective (every rank scores
        the global batch against its rows, see :func:`sharded_logits`)."""
        if isinstance(inputs, tf.RaggedTensor):
            return inputs.with_flat_values(self.logits(inputs.flat_values))
        if self.table.sharded:
            self.table.check_whole_rows()
            rows, offset = self.table.local_rows()
            return sharded_logits(
                inputs,
                rows,
                offset,
                self.num_classes,
                bias_rows=self._bias_rows(),
                name=f"mmde_tied_{self.table.name}_logits",
            )
        logits = tf.matmul(inputs, self.embeddings, transpose_b=True)
        return tf.nn.bias_add(logits, self._bias_rows()) if self.use_bias else logits

    def call(self, inputs, targets=None, training=False, testing=False, **kwargs):
        if not (self.vocab_parallel and (training or testing)):
            return self.logits(inputs)
        name = self.table.name
        if isinstance(targets, dict):
            if self.target not in targets:
                raise ValueError(
                    f"The tied output over table '{name}' needs the target "
                    f"'{self.target}'. Received targets: {sorted(targets)}"
                )
            targets = targets[self.target]
        if targets is None:
            raise ValueError(
                f"The tied output over table '{name}' needs targets (item ids) "
                "in fit / evaluate. Received: targets=None"
            )
        hidden, targets = _target_positions(inputs, targets)
        if self.logits_temperature != 1.0:
            hidden = hidden / self.logits_temperature
        rows, offset = self.table.local_rows()
        # the same catalog for the loss and the ranks: this rank's rows, bias and chunks
        catalog = dict(bias_rows=self._bias_rows(), chunk_rows=self.chunk_rows)
        losses = sharded_softmax_cross_entropy(
            hidden, targets, rows, offset, self.num_classes, name=f"mmde_tied_{name}", **catalog
        )
        if training:
            losses = _global_mean_share(losses, f"mmde_tied_{name}_count")
        # the targets Keras' metrics see: each target's rank among all items (top-k metrics)
        if self.top_k:
            ranks = sharded_target_rank(
                comm.after(hidden, losses),
                targets,
                rows,
                offset,
                self.num_classes,
                name=f"mmde_tied_{name}_rank",
                **catalog,
            )
        else:  # no top-k metrics: no ranking pass (compile refuses top-k metrics)
            ranks = tf.fill(tf.shape(losses), -1)
        return mm.Prediction(losses, ranks)

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([input_shape[0], self.num_classes])

    def get_config(self):
        return dict(
            super().get_config(),
            table=self.table.name,
            target=self.target,
            vocab_parallel=self.requested_vocab_parallel,
            chunk_rows=self.chunk_rows,
            use_bias=self.use_bias,
            bias_initializer=tf.keras.initializers.serialize(
                tf.keras.initializers.get(self.bias_initializer)
            ),
            logits_temperature=self.logits_temperature,
            top_k=list(self.top_k),
        )


def tie_to_handle(
    output_cls,
    to_call,
    kwargs: dict,
    vocab_parallel=None,
    chunk_rows=DEFAULT_CHUNK_ROWS,
    top_k=(10,),
    use_bias=False,
    bias_initializer="zeros",
):
    """Arguments of Merlin's ``output_cls(to_call=handle, **kwargs)`` for a table handle:
    ``(TiedTablePrediction, kwargs)`` with the target (default: the table's first feature,
    as Merlin's), the contrastive output's schema, and the sharded table's defaults."""
    kwargs = dict(kwargs)
    target = (
        kwargs.pop("target", None) or kwargs.pop("target_name", None) or to_call.col_schema.name
    )
    kwargs["target_name"] = target
    if issubclass(output_cls, mm.ContrastiveOutput):
        kwargs.setdefault("schema", Schema([to_call.col_schema]))
        return TiedTablePrediction(to_call, target, vocab_parallel=False), kwargs
    tied = TiedTablePrediction(
        to_call,
        target,
        vocab_parallel,
        chunk_rows,
        top_k=top_k,
        use_bias=use_bias,
        bias_initializer=bias_initializer,
    )
    if tied.vocab_parallel:
        tied.logits_temperature = kwargs.pop("logits_temperature", 1.0)
        kwargs.setdefault("default_loss", TiedSoftmaxLoss())
        kwargs.setdefault("default_metrics_fn", output_default_metrics)
    return tied, kwargs


# serialized under its first name, so models saved before the rename still load
@tf.keras.utils.register_keras_serializable(package="merlin_models_de", name="CategoricalOutput")
class TiedCategoricalOutput(mm.CategoricalOutput):
    """``mm.CategoricalOutput`` with this package's options for a table handle.

    Args:
        to_call: ``block["item_id"]`` of a ``DistributedEmbeddings`` block, or anything
            ``mm.CategoricalOutput`` takes (then this is exactly Merlin's output).
        vocab_parallel: None: when the table is sharded. True forces the vocab-parallel
            loss (also in one process, where it equals the full softmax); False never.
        chunk_rows: table rows scored at a time by the vocab-parallel loss.
        top_k: cutoffs of the default top-k metrics of the vocab-parallel path; () for none.
        use_bias, bias_initializer: a bias per item (Merlin's ``EmbeddingTablePrediction``
            options), sharded like the table.
        **kwargs: ``mm.CategoricalOutput``'s arguments (``target`` names the target column;
            the default is the first feature reading the table).
    """

    def __init__(
        self,
        to_call,
        vocab_parallel=None,
        chunk_rows=DEFAULT_CHUNK_ROWS,
        top_k=(10,),
        use_bias=False,
        bias_initializer="zeros",
        **kwargs,
    ):
        if isinstance(to_call, TableHandle):
            to_call, kwargs = tie_to_handle(
                mm.CategoricalOutput,
                to_call,
                kwargs,
                vocab_parallel,
                chunk_rows,
                top_k,
                use_bias,
                bias_initializer,
            )
        elif use_bias:
            raise ValueError(
                "use_bias=True needs to_call=block[<table>] of a "
                "DistributedEmbeddings block (Merlin's own tables take "
                "EmbeddingTablePrediction(table, use_bias=True)). Received: "
                f"to_call={type(to_call).__name__}"
            )
        super().__init__(to_call=to_call, **kwargs)


__all__ = ["TiedCategoricalOutput", "TiedSoftmaxLoss", "TiedTablePrediction", "tie_to_handle"]
