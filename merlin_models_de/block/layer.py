"""The DistributedEmbeddings block: dict of features -> ordered list -> backend -> dict.

Example:
    >>> import merlin.models.tf as mm, merlin_models_de  # doctest: +SKIP
    >>> emb = mm.DistributedEmbeddings(schema, dim=16, strategy="memory_balanced")  # doctest: +SKIP
    >>> model = mm.DLRMModel(schema, embeddings=emb, bottom_block=mm.MLPBlock([16]),
    ...                      prediction_tasks=mm.BinaryClassificationTask("click"))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable, Mapping

import tensorflow as tf
from merlin.models.tf.core.base import Block
from merlin.models.tf.utils.tf_utils import call_layer
from merlin.models.utils.schema_utils import (
    schema_to_tensorflow_metadata_json,
    tensorflow_metadata_json_to_schema,
)

from merlin_models_de import comm, compat
from merlin_models_de.backends.lookup import sequence_output
from merlin_models_de.backends.options import ExchangeOptions
from merlin_models_de.backends.registry import create, resolve
from merlin_models_de.backends.step import KeyUpdates, current_step
from merlin_models_de.backends.validate import ordered_inputs
from merlin_models_de.block import regularization as reg
from merlin_models_de.block.dynamic import (
    DynamicTablesMixin,
    backend_for_dynamic,
    dynamic_options,
)
from merlin_models_de.block.handles import (
    TableAccessMixin,
    bind_table_weights,
    remember_block,
    trainable_config,
)
from merlin_models_de.block.notices import one_rank_notice
from merlin_models_de.block.options import block_options, from_options_config, options_config
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.compat import tf_checkpoint
from merlin_models_de.persistence.keras_checkpoint import TableCheckpoints
from merlin_models_de.planner import PlacementOptions, placed_like
from merlin_models_de.planner import plan as make_plan
from merlin_models_de.tables import (
    feature_order,
    is_layer_combiner,
    narrow_table_bytes,
    tables_from_schema,
)

DEFAULT_CHUNK_BYTES = 256 * 2**20  # no collective message above this in get/set_global_weights
# mm.Embeddings' per-table keyword arguments whose meaning the block does not implement
UNSUPPORTED_TABLE_KWARGS = {
    "embeddings_constraint": "None",
    "mask_zero": "False",
    "weights": "None (use embeddings_initializer or set_global_weights)",
    "table": "None",
}
# EmbeddingOptions' fields, which Merlin's own code passes to mm.Embeddings (Wide&Deep) and
# users copy from it: mm.Embeddings forwards to its tables only what EmbeddingTable takes and
# drops these, so its table sizes come from ``dim`` / ``infer_dim_fn`` alone. The same here.
IGNORED_LIKE_MERLIN = (
    "embedding_dims",
    "embedding_dim_default",
    "infer_embedding_sizes",
    "infer_embedding_sizes_multiplier",
    "infer_embeddings_ensure_dim_multiple_of_8",
    "embeddings_initializers",
)


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class DistributedEmbeddings(
    TableAccessMixin,
    DynamicTablesMixin,
    tf_checkpoint.TableCheckpointMixin,
    keras_compat.UntrackedSublayersMixin,
    Block,
):
    """Model-parallel embedding tables; a drop-in for ``mm.Embeddings``.

    Each rank holds only its share of the tables (see :mod:`merlin_models_de.planner`); the
    block takes the same inputs as ``mm.Embeddings`` (dense ids, list / ragged features) and
    returns the same ``{feature: [batch, dim]}`` dict, shared tables included. In a single
    process (no horovodrun) it behaves like ``mm.Embeddings`` and needs no Horovod.

    Args:
        schema: Merlin schema; every column gets a table (as ``mm.Embeddings``) except those
            tagged TARGET, or CONTINUOUS without CATEGORICAL; a table has
            ``int_domain.max + 1`` rows; columns sharing ``int_domain.name`` share a table.
        dim: One width, a dict by feature / table name, or None to infer it.
        infer_dim_fn: ``column -> int`` where ``dim`` gives none (Merlin's heuristic).
        sequence_combiner: ``mean`` / ``sum`` / ``sqrtn`` pooling of list features, None
            (un-pooled ``[B, None, dim]``), a Keras layer applied to the un-pooled rows, or a
            dict of these by feature.
        embeddings_initializer: Keras initializer, or a dict by feature / table name.
        embeddings_regularizer: Keras regularizer, or a dict by feature / table name; adds
            ``reg(table)`` to the losses. On N ranks a sharded table takes L1 / L2 / L1L2
            (see :mod:`merlin_models_de.block.regularization`).
        trainable: Whether the tables train: a bool, or a dict by feature / table name.
        l2_batch_regularization_factor: Adds ``factor * sum(output ** 2)`` of each feature's
            looked-up batch to the losses (a float, or a dict by feature / table name).
        block_name: The block's name (``mm.Embeddings``' spelling of ``name``).
        placement: A :class:`~merlin_models_de.planner.options.PlacementOptions`: the
            strategy, the slicing and replication thresholds, the step ``work_balanced``
            places for and a cap per rank (see :func:`merlin_models_de.planner.plan`).
            Default: ``PlacementOptions()``, or the keywords ``strategy``,
            ``column_slice_threshold``, ``row_slice_threshold``, ``data_parallel_threshold``.
        exchange: An :class:`~merlin_models_de.backends.options.ExchangeOptions`: how the
            lookups run, its fields below. Default: ``ExchangeOptions()``, or its fields
            as keywords (a keyword with its object raises, naming both).
        activity_regularizer, table_cls, pre, post, aggregation: ``mm.Embeddings``'
            arguments (keywords); only their defaults are supported (others raise, naming
            them).
        dynamic_tables: ``{feature or table: DynamicTable(capacity=...)}``: tables whose ids are
            64-bit keys that get rows as they arrive (:mod:`merlin_models_de.dynamic`);
            ``horovod`` backend only.

    The exchange options (``ExchangeOptions``' fields):
        backend: ``auto`` (distributed-embeddings when installed, else ``horovod``),
            ``horovod`` or ``distributed-embeddings``.
        validate_ids: Fail with the feature and id when an id is outside its table (default);
            False skips the check for speed (TF's gather silently returns zeros on GPUs, a
            row-sliced table zero rows); ``fit`` then reports the epoch's ids outside their
            tables (``history.history["out_of_range_ids"]``, :meth:`out_of_range_ids`).
        exchange_dtype: ``"float16"`` or ``"bfloat16"``: looked-up rows and their gradients
            cross ranks in that dtype (half the bytes of float32), rounded once each way;
            one process rounds them the same, so it still reproduces N ranks. Rows of
            data-parallel and row-sliced tables are not rounded. None (default): the
            block's dtype. ``horovod`` backend only.
        table_dtype: ``"bfloat16"`` or ``"float16"``: the sharded tables' rows are stored in
            16 bits (half the memory), read into the block's dtype, and updated in float32
            then stochastically rounded (:mod:`merlin_models_de.kernels.rounding`), which needs an
            optimizer that updates 16-bit rows: :class:`merlin_models_de.RowWiseAdagrad`.
            Replicated tables keep the block's dtype. None (default): the block's dtype.
            ``horovod`` backend only.
        exchange_ahead: With ``fit``'s ``tf.data`` input on several ranks (``horovod``
            backend), each training step sends the next batch's ids with its rows and the
            next step starts from them: one exchange less before its lookups
            (:mod:`merlin_models_de.backends.horovod.ahead`). Default True; the result is the same.
        merge_backward: In a training step on several ranks (``horovod`` backend), the
            rows' gradients go back to their owners in the same all-to-all that averages
            the dense gradients, one round instead of two, when the model's optimizer is
            the one ``compile`` makes (:mod:`merlin_models_de.backends.horovod.backward`). Default
            True; the result is the same.

    Example:
        >>> emb = DistributedEmbeddings(schema, dim=16)  # doctest: +SKIP
        >>> outputs = emb({"user": tf.constant([1, 2]), "item": tf.constant([3, 4])})  # doctest: +SKIP
        >>> print(emb.summary())  # doctest: +SKIP
    """

    _mmde_embedding_block = True  # variables.BLOCK_ATTR: how model queries find the block

    def __init__(
        self,
        schema,
        dim=None,
        *,
        infer_dim_fn: Callable | None = None,
        sequence_combiner="mean",
        embeddings_initializer=None,
        embeddings_regularizer=None,
        trainable=True,
        block_name=None,
        l2_batch_regularization_factor=0.0,
        input_length=None,
        placement: PlacementOptions | None = None,
        exchange: ExchangeOptions | None = None,
        dynamic_tables=None,
        name="embeddings",
        **kwargs,
    ):
        compat.ensure_supported()
        _check_unsupported(kwargs)
        # the objects checked their values; the keywords they replace are gone from kwargs
        placement, exchange = block_options(placement, exchange, kwargs)
        super().__init__(name=block_name or name, trainable=trainable is not False, **kwargs)
        self.placement_options, self.exchange_options = placement, exchange
        sequence_combiner = _deserialize_combiner(sequence_combiner)
        self.dynamic_tables = dynamic_options(dynamic_tables)
        self.tables = tables_from_schema(
            schema,
            dim,
            infer_dim_fn=infer_dim_fn,
            combiner=sequence_combiner,
            dynamic=self.dynamic_tables,
        )
        self.features = tuple(feature_order(self.tables))
        names = {f.name for f in self.features}
        self.set_schema(schema.select_by_name([c for c in schema.column_names if c in names]))
        self.sequence_combiner = sequence_combiner
        # list features whose rows go through a Keras layer (mm.Embeddings does the same)
        self.combiner_layers = {
            f.name: layer
            for t in self.tables
            for f in t.features
            if f.multi_hot
            for layer in [_feature_value(sequence_combiner, t.features[0].name)]
            if is_layer_combiner(layer)
        }
        self.embeddings_initializer = embeddings_initializer
        for option, value in (
            ("embeddings_regularizer", embeddings_regularizer),
            ("trainable", trainable),
            ("l2_batch_regularization_factor", l2_batch_regularization_factor),
        ):
            reg.check_keys(option, value, self.tables)
        self.embeddings_regularizer = embeddings_regularizer
        self.table_regularizers = reg.regularizers(embeddings_regularizer, self.tables)
        self.l2_batch_regularization_factor = l2_batch_regularization_factor
        self.batch_l2 = reg.batch_l2_factors(l2_batch_regularization_factor, self.tables)
        self.table_trainable = reg.trainable_tables(trainable, self.tables)
        self._trainable_option = trainable
        self.input_length = input_length  # Keras' Embedding only uses it for shapes
        self.backend_name = resolve(
            backend_for_dynamic(exchange.backend, self.tables),
            self.features,
            exchange.exchange_dtype,
            exchange.table_dtype,
            strategy=placement.strategy,
        )
        self.rank, self.world_size = comm.rank(), comm.size()
        self.plan = make_plan(self.tables, self.world_size, placement)
        one_rank_notice(self.world_size)  # once per process: nothing is split here
        reg.check_regularizers(self.table_regularizers, self.plan)
        self.backend = self._new_backend()
        if self.backend_name != "horovod" and len(set(self.table_trainable.values())) > 1:
            frozen = sorted(t for t, on in self.table_trainable.items() if not on)
            raise NotImplementedError(
                f"backend={self.backend_name!r} trains all tables or none; tables {frozen} "
                f"are frozen by trainable={trainable!r}. Use backend='horovod'."
            )
        self.handles_by_name()  # every rank makes the same layers, in the same order
        remember_block(self)  # where a deserialized tied output finds its table

    # the exchange options as the backends and hooks read them off the block
    @property
    def validate_ids(self) -> bool:
        return self.exchange_options.validate_ids

    @property
    def exchange_dtype(self) -> str | None:
        return self.exchange_options.exchange_dtype

    @property
    def table_dtype(self) -> str | None:
        return self.exchange_options.table_dtype

    @property
    def exchange_ahead(self) -> bool:  # see backends/horovod/ahead.py
        return self.exchange_options.exchange_ahead

    @property
    def merge_backward(self) -> bool:  # see backends/horovod/backward.py
        return self.exchange_options.merge_backward

    @property
    def per_table_trainable(self) -> bool:
        """Can one table be frozen alone (``block[t].trainable = False``)?"""
        return self.backend_name == "horovod"

    # ---- keras ---------------------------------------------------------------------------------

    def _initializer(self, table: str):
        init = self.embeddings_initializer
        if hasattr(init, "items") and "class_name" not in init:
            spec = next((t for t in self.tables if t.name == table))
            init = init.get(
                table, next((init[f.name] for f in spec.features if f.name in init), None)
            )
        return tf.keras.initializers.get(init or "uniform")

    def build(self, input_shapes):
        # per table, every variable is trainable and its handle's flag decides (so a table
        # can be frozen and resumed); the other backend takes one bool
        trainable = True if self.per_table_trainable else all(self.table_trainable.values())
        self.backend.build(self, self._initializer, trainable)
        if self.per_table_trainable:
            bind_table_weights(self)
        self.engine_layers = self.backend.sublayers()  # tracked: their weights are the block's
        # checkpoints and SavedModels name tables, not this rank's layout (see persistence/keras_checkpoint.py)
        self.table_checkpoints = TableCheckpoints(self)
        reg.add_table_losses(self, self.backend, self.plan, self.rank, self.table_regularizers)
        return super().build(input_shapes)

    # Plain TF ops without tensor-dependent Python control flow: autograph's conversion of
    # the backend (parsing and rewriting its source at every trace) only costs startup time.
    @tf.autograph.experimental.do_not_convert
    def call(self, inputs, training=False, selected=None, **kwargs):
        """``{feature: ids}`` (extra keys ignored) -> ``{feature: [batch, dim]}``.

        ``selected`` (a :class:`~merlin_models_de.block.views.FeatureSelection`'s call): only these
        features are given and returned; the others take part in the exchanges with
        placeholder ids (every rank runs the same exchanges) and are dropped.
        """
        if not isinstance(inputs, Mapping):
            raise ValueError(
                f"DistributedEmbeddings takes a dict of features. "
                f"Received: {type(inputs).__name__}"
            )
        if selected is not None:
            inputs = with_placeholders(inputs, self.features, selected)
        ordered, problems = ordered_inputs(inputs, self.features, self.key_features)
        found = [p for p in problems if isinstance(p, str)]  # (the others: checks of values)
        if found and self.world_size == 1:
            raise ValueError(found[0])  # nobody to wait for: fail at once
        # on several ranks a problem travels in the first exchange, so every rank fails
        following, waiting, optimizer_state = self._step_values(inputs, training, selected)
        # a selection's other features carry placeholder ids: their keys are not counted
        placeholders = frozenset(
            f.name for f in self.features if selected is not None and f.name not in selected
        )
        outputs = self.backend.call(
            ordered,
            training=training,
            problems=problems,
            following=following,
            waiting=waiting,
            key_updates=KeyUpdates(optimizer_state, placeholders),
        )
        dims = {t.name: t.dim for t in self.tables}
        # (a feature missing here has already failed every rank in the exchange's checks)
        result = {
            f.name: sequence_output(out, inputs[f.name], dims[f.table])
            if f.multi_hot and f.combiner is None and f.name in inputs
            else out
            for f, out in zip(self.features, outputs)
        }
        result = {name: _static_batch(out, inputs.get(name)) for name, out in result.items()}
        for name, layer in self.combiner_layers.items():
            # as Merlin's tables: the layer gets the call's kwargs it accepts (``features``)
            result[name] = call_layer(layer, result[name], training=training, **kwargs)
        if selected is not None:
            result = {name: result[name] for name in selected}
        for f in self.features:
            factor = self.batch_l2.get(f.table)
            if factor and f.name in result:
                self.add_loss(reg.batch_l2_loss(result[f.name], factor, self.world_size))
        return result

    def _step_values(self, inputs, training, selected):
        """``(following, waiting, optimizer_state)`` of the training step being traced
        (``backends/step.py``): the next batch's ids when this call reads the step's batch
        (this step sends them, ``backends/horovod/ahead.py``), the list where the exchanges'
        backward waits for the optimizer (``backends/horovod/backward.py``), and what a
        dynamic table's new rows start from; None each otherwise."""
        step = current_step()
        if step is None or not training:
            return None, None, None
        following = None
        if selected is None and self.exchange_ahead:
            following = step.next_batch_for(id(self), [f.name for f in self.features], inputs)
        if following is not None:
            following = ordered_inputs(following, self.features, self.key_features)
        waiting = step.waiting if self.merge_backward else None
        return following, waiting, step.optimizer_state

    def checkpoint_children(self, children: dict) -> dict:
        """The block's dependencies in checkpoints: one per table (see
        :mod:`merlin_models_de.persistence.keras_checkpoint`)."""
        state = getattr(self, "table_checkpoints", None)  # None until built
        return children if state is None else state.to_save(children)

    def checkpoint_dependency(self, name: str, found):
        """What a saved dependency ``name`` stands for (see
        :mod:`merlin_models_de.persistence.keras_checkpoint`)."""
        state = getattr(self, "table_checkpoints", None)
        # unbuilt: Keras asks for every weight it adds; a restore waiting for an older
        # layout's name is matched when the table dependencies appear (persistence/keras_checkpoint.py)
        return found if state is None else state.lookup(name, found)

    def compute_output_shape(self, input_shapes):
        """``[batch, dim]``, or for un-pooled list features ``[batch, k or None, dim]`` (as
        ``mm.Embeddings``: a trailing 1 of the input is dropped)."""
        dims = {t.name: t.dim for t in self.tables}
        out = {}
        for f in self.features:
            shape = _shape(input_shapes.get(f.name) if hasattr(input_shapes, "get") else None)
            batch = shape[0] if shape.rank else None
            if f.multi_hot and f.combiner is None and f.name not in self.combiner_layers:
                if shape.rank and shape.rank > 1:
                    first = shape[:-1] if shape[-1] == 1 and shape.rank > 2 else shape
                else:
                    first = tf.TensorShape([batch, None])
                out[f.name] = tf.TensorShape(list(first) + [dims[f.table]])
            else:
                out[f.name] = tf.TensorShape([batch, dims[f.table]])
        return out

    def get_config(self):
        config = super().get_config()
        config.update(
            schema=schema_to_tensorflow_metadata_json(self.schema),
            dim={t.name: t.dim for t in self.tables},  # resolved: infer_dim_fn is not saved
            sequence_combiner=_serialize_combiner(self.sequence_combiner),
            embeddings_initializer=_serialize(self.embeddings_initializer),
            embeddings_regularizer=_serialize(self.embeddings_regularizer, tf.keras.regularizers),
            trainable=trainable_config(self, _plain(self._trainable_option)),
            l2_batch_regularization_factor=_plain(self.l2_batch_regularization_factor),
            input_length=self.input_length,
            dynamic_tables={k: asdict(v) for k, v in self.dynamic_tables.items()} or None,
            **options_config(self.placement_options, self.exchange_options),
        )
        return config

    @classmethod
    def from_config(cls, config):
        # a config saved before the option objects holds their keywords, which the block takes
        config = from_options_config(config)
        config["schema"] = tensorflow_metadata_json_to_schema(config["schema"])
        return cls(**config)  # initializers stay serialized; _initializer() resolves them

    # ---- plan and weights --------------------------------------------------------------------

    def place_like(self, plan, table: str) -> None:
        """Lays this block's one table out as ``table`` is in ``plan`` (same ranks, same row
        ranges; see :func:`merlin_models_de.planner.placed_like`). Before build, on every
        rank: a per-row companion (a tied output's item bias) then sits with its rows."""
        if self.built or len(self.tables) != 1:
            raise ValueError(
                f"place_like needs an unbuilt block with one table; block "
                f"'{self.name}' has tables {[t.name for t in self.tables]}"
                f"{' and is built' if self.built else ''}."
            )
        self.plan = placed_like(plan, table, self.tables[0])
        self.backend = self._new_backend()

    def _new_backend(self):
        """The backend of ``self.plan`` with the block's options."""
        return create(
            self.backend_name,
            self.plan,
            self.features,
            self.rank,
            validate_ids=self.validate_ids,
            exchange_dtype=self.exchange_dtype,
            table_dtype=self.table_dtype,
        )

    # the compiled model's optimizer: its name and extra copies per parameter (plain values,
    # which Keras does not track); set by the compile hook (merlin/hooks.py)
    compiled_optimizer_name: str | None = None
    compiled_optimizer_slots: int | None = None

    def summary(self, optimizer: str | None = None) -> str:
        """The placement summary, with the backend that runs it, and this rank's counters of
        each dynamic table. Bytes with slots count the slots of ``optimizer`` (a name), else
        of the compiled model's optimizer, else sgd's."""
        compiled = optimizer is None and self.compiled_optimizer_name is not None
        narrow = narrow_table_bytes(self.table_dtype)
        table = (
            self.plan.summary(
                optimizer=self.compiled_optimizer_name,
                slots=self.compiled_optimizer_slots,
                table_bytes=narrow,
            )
            if compiled
            else self.plan.summary(optimizer=optimizer or "sgd", table_bytes=narrow)
        )
        dynamic = self.dynamic_summary()
        return f"backend={self.backend_name}\n{table}" + (f"\n{dynamic}" if dynamic else "")

    @property
    def local_variables(self) -> list:
        """Variables that differ by rank (sharded tables); never allreduce or broadcast them."""
        return self.backend.local_variables()

    def out_of_range_ids(self, reset: bool = False) -> dict | None:
        """With ``validate_ids=False`` on several ranks: ``{feature: count}`` of the ids outside
        their table this rank has looked up since the last reset (a row-sliced table reads zero
        rows for them; ``fit`` reports the sum over ranks each epoch). None when ids are
        validated or in one process (there an id outside its table raises on CPU)."""
        counter = self.backend.out_of_range if self.built else None
        if counter is None:
            return None
        counts = dict(zip((f.name for f in self.backend.features), counter.numpy().tolist()))
        if reset:
            counter.assign(tf.zeros_like(counter))
        return counts

    def get_global_weights(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict:
        """Collective: ``{table: full NumPy array}`` on every rank, moved in chunks."""
        self.ensure_built()
        return {t.name: self.backend.get_table(t.name, chunk_bytes) for t in self.tables}

    def set_global_weights(
        self,
        arrays: Mapping | None,
        root_rank: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        """Collective: writes full tables into the owners' shards.

        Args:
            arrays: ``{table: array}``; every rank passes the same arrays, or, with
                ``root_rank``, only that rank does (others pass None) and the data is
                broadcast in chunks.
            root_rank: See ``arrays``.
        """
        self.ensure_built()
        if arrays is not None:
            unknown = sorted(set(arrays) - {t.name for t in self.tables})
            if unknown:
                raise ValueError(
                    f"Unknown tables: {unknown}. Known: {[t.name for t in self.tables]}"
                )
        for t in self.tables:
            array = arrays.get(t.name) if arrays is not None else None
            if arrays is not None and array is None and root_rank is None:
                raise ValueError(f"Missing table '{t.name}' in arrays")
            self.backend.set_table(t.name, array, root_rank, chunk_bytes)

    def ensure_built(self):
        if not self.built:
            self.build({f.name: tf.TensorShape([None]) for f in self.features})


def _plain(value):
    """Keras wraps dict attributes in trackable wrappers; configs need plain dicts."""
    if hasattr(value, "items") and not isinstance(value, str):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _serialize(init, module=tf.keras.initializers):
    """Initializers / regularizers (or dicts of them) -> configs; ``get`` reads them back."""
    if init is None or isinstance(init, str):
        return init
    if hasattr(init, "items") and "class_name" in init:  # already a config (from_config)
        return _plain(init)
    if hasattr(init, "items"):
        return {k: _serialize(v, module) for k, v in init.items()}
    return module.serialize(module.get(init))


def _feature_value(value, feature: str):
    return value.get(feature) if reg.is_by_name(value) else value


def with_placeholders(inputs, features, selected):
    """``inputs`` plus id 0 for every feature outside ``selected`` (one id per example, the
    batch size of the first selected feature), so that a selection runs the exchanges of the
    whole block."""
    first = next((inputs[name] for name in selected if name in inputs), None)
    if first is None:
        return inputs  # the missing features are reported by the input checks
    batch = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
    filled = dict(inputs)
    for f in features:
        if f.name not in selected:
            filled[f.name] = tf.zeros(tf.stack([tf.cast(batch, tf.int32), 1]), tf.int64)
    return filled


def _serialize_combiner(value):
    """Keras layers become their Keras config (as ``mm.Embeddings``' tables save them)."""
    if is_layer_combiner(value):
        return tf.keras.layers.serialize(value)
    if reg.is_by_name(value):
        return {k: _serialize_combiner(v) for k, v in value.items()}  # a plain dict
    return value


def _deserialize_combiner(value):
    if hasattr(value, "items") and "class_name" in value:
        return tf.keras.layers.deserialize(dict(value))
    if reg.is_by_name(value):
        return {k: _deserialize_combiner(v) for k, v in value.items()}
    return value


def _shape(shape) -> tf.TensorShape:
    """An input's shape (a TensorShape, a list, or unknown) as a TensorShape."""
    try:
        return tf.TensorShape(shape)
    except (TypeError, ValueError):
        return tf.TensorShape(None)


def _check_unsupported(kwargs):
    """``mm.Embeddings`` arguments whose meaning the block does not implement raise, named;
    their defaults are taken out of ``kwargs``."""
    from merlin.models.tf.inputs.embedding import EmbeddingTable

    given = {
        option: (kwargs.pop(option, None), "None")
        for option in ("activity_regularizer", "pre", "post", "aggregation")
    }
    table_cls = kwargs.pop("table_cls", None)
    if table_cls not in (None, EmbeddingTable):
        given["table_cls"] = (table_cls, "None or mm.EmbeddingTable")
    for key in IGNORED_LIKE_MERLIN:
        kwargs.pop(key, None)
    for key, default in UNSUPPORTED_TABLE_KWARGS.items():
        if key in kwargs:
            value = kwargs.pop(key)
            if value is not None and value is not False:
                given[key] = (value, default)
    for key, (value, default) in given.items():
        if value is not None:
            raise NotImplementedError(
                f"DistributedEmbeddings does not support {key} (supported: {default}). "
                f"Received: {key}={value!r}"
            )


def _static_batch(out, ids):
    """``out`` with its input's static batch size: outputs that came through an exchange lose
    it in a graph, and Merlin's concatenation refuses features whose batch sizes differ
    statically (one known, one not)."""
    shape = getattr(ids, "shape", None)
    batch = shape[0] if shape is not None and shape.rank else None
    if (
        batch is None
        or not isinstance(out, tf.Tensor)
        or out.shape.rank is None
        or out.shape[:1].is_fully_defined()
    ):
        return out
    return tf.ensure_shape(out, [batch] + out.shape.as_list()[1:])
