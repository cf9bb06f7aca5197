"""The DistributedEmbeddings block: dict of features -> ordered list -> backend -> dict.

Example:
    >>> import merlin.models.tf as mm, merlin_models_de  # doctest: +SKIP
    >>> emb = mm.DistributedEmbeddings(schema, dim=16, strategy="memory_balanced")  # doctest: +SKIP
    >>> model = mm.DLRMModel(schema, embeddings=emb, bottom_block=mm.MLPBlock([16]),
    ...                      prediction_tasks=mm.BinaryClassificationTask("click"))  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Callable, Mapping

import tensorflow as tf
from merlin.models.tf.core.base import Block
from merlin.models.utils.schema_utils import (schema_to_tensorflow_metadata_json,
                                              tensorflow_metadata_json_to_schema)

from merlin_models_de import comm, compat, integration
from merlin_models_de.backends.lookup import sequence_output
from merlin_models_de.backends.validate import ordered_inputs
from merlin_models_de.backends.registry import create, resolve
from merlin_models_de.planner import plan as make_plan
from merlin_models_de.planner import validate_options
from merlin_models_de.reload import TableCheckpoints
from merlin_models_de.tables import feature_order, tables_from_schema

DEFAULT_CHUNK_BYTES = 256 * 2**20  # no collective message above this in get/set_global_weights


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class DistributedEmbeddings(compat.TableCheckpointMixin, Block):
    """Model-parallel embedding tables; a drop-in for ``mm.Embeddings``.

    Each rank holds only its share of the tables (see :mod:`merlin_models_de.planner`); the
    block takes the same inputs as ``mm.Embeddings`` (dense ids, list / ragged features) and
    returns the same ``{feature: [batch, dim]}`` dict, shared tables included. In a single
    process (no horovodrun) it behaves like ``mm.Embeddings`` and needs no Horovod.

    Args:
        schema: Merlin schema; every categorical, non-target column gets a table, sized by
            ``int_domain.max + 1``; columns sharing ``int_domain.name`` share a table.
        dim: One width, a dict by feature / table name, or None to infer it.
        infer_dim_fn: ``column -> int`` where ``dim`` gives none (Merlin's heuristic).
        sequence_combiner: ``mean`` / ``sum`` / ``sqrtn`` pooling of list features (or a dict).
        embeddings_initializer: Keras initializer, or a dict by feature / table name.
        embeddings_regularizer: Keras regularizer (world size 1 only, see below).
        trainable: Whether the tables train.
        strategy, column_slice_threshold, row_slice_threshold, data_parallel_threshold:
            Placement options (see :func:`merlin_models_de.planner.plan`).
        backend: ``auto`` (distributed-embeddings when installed, else ``horovod``),
            ``horovod`` or ``distributed-embeddings``.
        validate_ids: Fail with the feature and id when an id is outside its table (default);
            False skips the check for speed (TF's gather silently returns zeros on GPUs).

    Example:
        >>> emb = DistributedEmbeddings(schema, dim=16)  # doctest: +SKIP
        >>> outputs = emb({"user": tf.constant([1, 2]), "item": tf.constant([3, 4])})  # doctest: +SKIP
        >>> print(emb.summary())  # doctest: +SKIP
    """

    _mmde_embedding_block = True  # variables.BLOCK_ATTR: how model queries find the block

    def __init__(self, schema, dim=None, *, infer_dim_fn: Callable | None = None,
                 sequence_combiner="mean", embeddings_initializer=None,
                 embeddings_regularizer=None, trainable=True, strategy="basic",
                 column_slice_threshold=None, row_slice_threshold=None,
                 data_parallel_threshold=None, backend="auto", validate_ids=True,
                 name="embeddings", **kwargs):
        compat.ensure_supported()
        integration.install()
        super().__init__(name=name, trainable=trainable, **kwargs)
        validate_options(1, strategy, column_slice_threshold, row_slice_threshold,
                         data_parallel_threshold)
        self.tables = tables_from_schema(schema, dim, infer_dim_fn=infer_dim_fn,
                                         combiner=sequence_combiner)
        self.features = tuple(feature_order(self.tables))
        names = {f.name for f in self.features}
        self.set_schema(schema.select_by_name([c for c in schema.column_names if c in names]))
        self.sequence_combiner = sequence_combiner
        self.embeddings_initializer = embeddings_initializer
        self.embeddings_regularizer = tf.keras.regularizers.get(embeddings_regularizer)
        self.options = dict(strategy=strategy, column_slice_threshold=column_slice_threshold,
                            row_slice_threshold=row_slice_threshold,
                            data_parallel_threshold=data_parallel_threshold)
        self.backend_name = resolve(backend, self.features)
        self.validate_ids = validate_ids
        self._requested_backend = backend
        self.rank, self.world_size = comm.rank(), comm.size()
        if self.embeddings_regularizer is not None and self.world_size > 1:
            raise NotImplementedError(
                "embeddings_regularizer with model-parallel tables (world size > 1) is not "
                f"supported yet. Received: embeddings_regularizer={embeddings_regularizer!r}")
        self.plan = make_plan(self.tables, self.world_size, **self.options)
        self.backend = create(self.backend_name, self.plan, self.features, self.rank,
                              validate_ids=validate_ids)

    # ---- keras ---------------------------------------------------------------------------------

    def _initializer(self, table: str):
        init = self.embeddings_initializer
        if hasattr(init, "items") and "class_name" not in init:
            spec = next((t for t in self.tables if t.name == table))
            init = init.get(table, next((init[f.name] for f in spec.features if f.name in init),
                                        None))
        return tf.keras.initializers.get(init or "uniform")

    def build(self, input_shapes):
        self.backend.build(self, self._initializer, self.trainable)
        self.engine_layers = self.backend.sublayers()  # tracked: their weights are the block's
        # checkpoints and SavedModels name tables, not this rank's layout (see reload.py)
        self.table_checkpoints = TableCheckpoints(self)
        if self.embeddings_regularizer is not None:
            for var in self.trainable_weights:
                self.add_loss(lambda v=var: self.embeddings_regularizer(v))
        return super().build(input_shapes)

    # Plain TF ops without tensor-dependent Python control flow: autograph's conversion of
    # the backend (parsing and rewriting its source at every trace) only costs startup time.
    @tf.autograph.experimental.do_not_convert
    def call(self, inputs, training=False, **kwargs):
        """``{feature: ids}`` (extra keys ignored) -> ``{feature: [batch, dim]}``."""
        if not isinstance(inputs, Mapping):
            raise ValueError(f"DistributedEmbeddings takes a dict of features. "
                             f"Received: {type(inputs).__name__}")
        ordered, problems = ordered_inputs(inputs, self.features)
        if problems and self.world_size == 1:
            raise ValueError(problems[0])  # nobody to wait for: fail at once
        # on several ranks a problem travels in the first exchange, so every rank fails
        outputs = self.backend.call(ordered, training=training, problems=problems)
        dims = {t.name: t.dim for t in self.tables}
        # (a feature missing here has already failed every rank in the exchange's checks)
        return {f.name: sequence_output(out, inputs[f.name], dims[f.table])
                if f.multi_hot and f.combiner is None and f.name in inputs else out
                for f, out in zip(self.features, outputs)}

    def checkpoint_children(self, children: dict) -> dict:
        """The block's dependencies in checkpoints: one per table (see :mod:`.reload`)."""
        state = getattr(self, "table_checkpoints", None)  # None until built
        return children if state is None else state.to_save(children)

    def checkpoint_dependency(self, name: str, found):
        """What a saved dependency ``name`` stands for (see :mod:`.reload`)."""
        state = getattr(self, "table_checkpoints", None)
        # unbuilt: Keras asks for every weight it adds; a restore waiting for an older
        # layout's name is matched when the table dependencies appear (reload.py)
        return found if state is None else state.lookup(name, found)

    def compute_output_shape(self, input_shapes):
        first = input_shapes[self.features[0].name]
        batch = first[0] if isinstance(first, tf.TensorShape) else None
        dims = {t.name: t.dim for t in self.tables}
        return {f.name: tf.TensorShape([batch, dims[f.table]]) for f in self.features}

    def get_config(self):
        config = super().get_config()
        config.update(
            schema=schema_to_tensorflow_metadata_json(self.schema),
            dim={t.name: t.dim for t in self.tables},  # resolved: infer_dim_fn is not saved
            sequence_combiner=_plain(self.sequence_combiner),
            embeddings_initializer=_serialize(self.embeddings_initializer),
            embeddings_regularizer=tf.keras.regularizers.serialize(self.embeddings_regularizer)
            if self.embeddings_regularizer is not None else None,
            backend=self._requested_backend, validate_ids=self.validate_ids, **self.options)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["schema"] = tensorflow_metadata_json_to_schema(config["schema"])
        return cls(**config)  # initializers stay serialized; _initializer() resolves them

    # ---- plan and weights --------------------------------------------------------------------

    def summary(self, optimizer: str = "sgd") -> str:
        """The placement summary, with the backend that runs it."""
        return f"backend={self.backend_name}\n" + self.plan.summary(optimizer=optimizer)

    @property
    def local_variables(self) -> list:
        """Variables that differ by rank (sharded tables); never allreduce or broadcast them."""
        return self.backend.local_variables()

    def get_global_weights(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict:
        """Collective: ``{table: full NumPy array}`` on every rank, moved in chunks."""
        self._ensure_built()
        return {t.name: self.backend.get_table(t.name, chunk_bytes) for t in self.tables}

    def set_global_weights(self, arrays: Mapping | None, root_rank: int | None = None,
                           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        """Collective: writes full tables into the owners' shards.

        Args:
            arrays: ``{table: array}``; every rank passes the same arrays, or, with
                ``root_rank``, only that rank does (others pass None) and the data is
                broadcast in chunks.
            root_rank: See ``arrays``.
        """
        self._ensure_built()
        if arrays is not None:
            unknown = sorted(set(arrays) - {t.name for t in self.tables})
            if unknown:
                raise ValueError(f"Unknown tables: {unknown}. Known: {[t.name for t in self.tables]}")
        for t in self.tables:
            array = arrays.get(t.name) if arrays is not None else None
            if arrays is not None and array is None and root_rank is None:
                raise ValueError(f"Missing table '{t.name}' in arrays")
            self.backend.set_table(t.name, array, root_rank, chunk_bytes)

    def _ensure_built(self):
        if not self.built:
            self.build({f.name: tf.TensorShape([None]) for f in self.features})


def _plain(value):
    """Keras wraps dict attributes in trackable wrappers; configs need plain dicts."""
    if hasattr(value, "items") and not isinstance(value, str):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _serialize(init):
    if init is None or isinstance(init, str):
        return init
    if hasattr(init, "items"):
        return {k: _serialize(v) for k, v in init.items()}
    return tf.keras.initializers.serialize(tf.keras.initializers.get(init))

