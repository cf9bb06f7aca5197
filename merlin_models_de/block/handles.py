"""Per-table handles of a DistributedEmbeddings block: ``block["item_id"]`` as in mm.Embeddings.

A :class:`TableHandle` is a plain object (not a Keras layer): it owns and tracks no
variables, so a model never counts or saves a table twice. Its lookups are collective (every
rank calls them, each with its own ids); see :mod:`merlin_models_de.backends.horovod.table_lookup`.

Example:
    >>> item = block["item_id"]  # doctest: +SKIP
    >>> vectors = item.embedding_lookup(tf.constant([3, 7]))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars

import tensorflow as tf
from merlin.models.tf.core.base import Block
from merlin.schema import Schema

from merlin_models_de.backends.lookup import combiner_weights
from merlin_models_de.block.views import FeatureSelection
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.kernels.rounding import read_wide
from merlin_models_de.planner.types import ShardingType

# Blocks built while a model is deserialized, per open scope (innermost last). Not a
# process-wide registry: outside a scope no name is bound, and two models rebuilt one after
# the other never see each other's blocks.
_SCOPES: contextvars.ContextVar = contextvars.ContextVar("mmde_named_tables", default=())


@contextlib.contextmanager
def named_tables(*blocks):
    """Inside, a table named by a string (a tied output's or a top-k layer's config) binds to
    a table of ``blocks`` or of a block built inside, the newest first.

    Merlin models open one around their ``from_config`` (which ``load_model`` and the export's
    copy go through), so a rebuilt output finds its own model's block; open one yourself to
    rebuild such a layer on its own: ``with named_tables(block): ShardedTopK.from_config(c)``.
    """
    token = _SCOPES.set(_SCOPES.get() + (list(blocks),))
    try:
        yield
    finally:
        _SCOPES.reset(token)


def remember_block(block) -> None:
    """Records a block built while names are bound (in every open scope: an inner model's
    block stays visible to the outer model's outputs)."""
    for scope in _SCOPES.get():
        scope.append(block)


def table_named(name: str) -> "TableHandle":
    """The handle of table ``name`` in the newest block of the open scopes (see
    :func:`named_tables`)."""
    scopes = _SCOPES.get()
    for scope in reversed(scopes):
        for block in reversed(scope):
            if any(t.name == name for t in block.tables):
                return block[name]
    where = (
        "no DistributedEmbeddings block built in this model has it"
        if scopes
        else "names are bound only while a model is rebuilt from its config"
    )
    raise ValueError(
        f"Cannot bind table {name!r}: {where}. Pass the table handle "
        f"(block[{name!r}]), or rebuild inside "
        "merlin_models_de.named_tables(block)."
    )


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class TableHandle(Block):
    """One table of a block: its shape, schema, (collective) lookups and ``trainable`` flag.

    A Keras layer that Merlin and Keras find when they walk the block (``get_blocks_by_name``,
    ``freeze_blocks``, ``MultiOptimizer``'s ``OptimizerBlocks``, ``summary``): its weights are
    this rank's shards of the table (none where the rank holds no part of it), so setting
    ``trainable`` freezes or resumes exactly this table. The block creates the variables and
    is the only one that tracks them (checkpoints name tables, see
    :mod:`merlin_models_de.persistence.keras_checkpoint`); the handle lists them untracked.
    """

    def __init__(self, block, name: str):
        object.__setattr__(self, "block", block)  # untracked: the block is not its sublayer
        super().__init__(name=name, trainable=block.table_trainable.get(name, True))
        features = [block.schema[f.name] for f in block.plan.table(name).features]
        self.set_schema(Schema(features))

    spec = property(lambda self: self.block.plan.table(self.name))
    table_name = property(lambda self: self.name)
    input_dim = property(lambda self: self.spec.rows)
    dim = property(lambda self: self.spec.dim)
    table = property(lambda self: self)  # Merlin reads ``table.table.embeddings``

    @property
    def built(self) -> bool:
        return bool(self.block.built)

    @built.setter
    def built(self, value):  # Keras sets it; the block's build decides
        del value

    @property
    def trainable(self) -> bool:
        return self._trainable

    @trainable.setter
    def trainable(self, value):
        value = bool(value)
        if value != self._trainable and not self.block.per_table_trainable:
            raise NotImplementedError(
                f"backend={self.block.backend_name!r} trains all tables or none; cannot set "
                f"trainable={value} on table '{self.name}' alone. Set the block's trainable, "
                "or use backend='horovod'."
            )
        self._trainable = value

    def get_config(self):
        return {"name": self.name, "table": self.name, "block": self.block.name}

    @classmethod
    def from_config(cls, config):
        """The table of that name in the model being rebuilt (see :func:`named_tables`): a
        handle is a view of its block, never made alone (a MultiOptimizer's config names it)."""
        return table_named(config["table"])

    @property
    def features(self) -> dict:
        """``{feature: ColumnSchema}`` of the features reading this table (as Merlin)."""
        return {f.name: self.block.schema[f.name] for f in self.spec.features}

    @property
    def col_schema(self):
        return next(iter(self.features.values()))

    @property
    def sequence_combiner(self):
        combiner = self.block.sequence_combiner
        if hasattr(combiner, "items"):
            return combiner.get(self.col_schema.name)
        return combiner

    def _whole(self) -> bool:
        return (
            self.block.world_size == 1
            or self.block.plan.kind_of(self.name) is ShardingType.DATA_PARALLEL
        )

    @property
    def embeddings(self):
        """The full table variable, only where every rank holds it whole."""
        self.block.ensure_built()
        if not self._whole():
            raise ValueError(
                f"Table '{self.name}' is sharded across {self.block.world_size} ranks "
                f"({self.block.plan.kind_of(self.name).value}); its full matrix is on no rank. "
                "Use embedding_lookup(ids) for rows, or block.get_global_weights() "
                "(collective: every rank calls it) for a NumPy copy."
            )
        shard = self.block.plan.shards_of(self.name)[0]
        var, first = self.block.backend.shard_variable(shard)
        whole = var if first == 0 and var.shape[0] == self.spec.rows else None
        return self._read(whole if whole is not None else var[first : first + self.spec.rows])

    def _read(self, rows):
        """``rows`` of this table in the block's dtype (a 16-bit table is read widened)."""
        dtype = self.block.backend.dtype
        return read_wide(rows, dtype)  # its gradient stays in dtype

    @property
    def sharded(self) -> bool:
        """True when no rank holds the whole table (more than one rank, not data-parallel)."""
        return not self._whole()

    def check_whole_rows(self) -> None:
        """Raises unless each rank holds whole rows (column slices split every row)."""
        if self.block.plan.kind_of(self.name) is ShardingType.COLUMN_WISE:
            raise ValueError(
                f"Table '{self.name}' is column-sliced across ranks; scoring against the whole "
                "catalog needs whole rows on each rank. Place it by rows (row_slice_threshold) "
                "or whole (raise column_slice_threshold above its "
                f"{self.spec.rows * self.spec.dim} elements)."
            )

    def local_rows(self):
        """``(rows [R, dim], row_offset)``: this rank's rows of the table, for outputs that
        score hidden states against the catalog (:mod:`merlin_models_de.outputs.vocab_parallel`).

        Row slices give each rank its range; a table placed whole on one rank gives the
        others 0 rows. Column slices raise (every rank would hold part of every row).
        """
        self.check_whole_rows()
        self.block.ensure_built()
        mine = [s for s in self.block.plan.shards_of(self.name) if s.rank == self.block.rank]
        if not mine:  # the table lives whole on another rank
            return tf.zeros([0, self.dim], self.block.backend.dtype), 0
        shard = mine[0]
        var, first = self.block.backend.shard_variable(shard)
        if first == 0 and var.shape[0] == shard.rows:
            return self._read(var), shard.row_start
        return self._read(var[first : first + shard.rows]), shard.row_start

    def build(self, input_shapes=None):
        self.block.ensure_built()

    def call(self, inputs, **kwargs):
        return self(inputs, **kwargs)

    def embedding_lookup(self, ids):
        """Collective: ``ids`` (any shape, any count per rank) -> ``[*ids.shape, dim]``."""
        self.block.ensure_built()
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(self.embedding_lookup(ids.flat_values))
        ids = tf.convert_to_tensor(ids)
        problems = []
        if not ids.dtype.is_integer:
            problems = [f"Table '{self.name}' takes integer ids. Received: dtype={ids.dtype.name}"]
            ids = tf.zeros([0], tf.int64)
        backend = self.block.backend
        if not hasattr(backend, "lookup_table"):
            raise NotImplementedError(
                f"embedding_lookup of table '{self.name}' is not supported by backend="
                f"'{self.block.backend_name}'; use backend='horovod'."
            )
        rows = backend.lookup_table(self.name, ids, problems)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))

    def __call__(self, inputs, **kwargs):
        """Like Merlin's EmbeddingTable: a tensor of ids, or a dict with this table's features."""
        if hasattr(inputs, "items"):
            return {f: self._call_table(inputs[f]) for f in self.features if f in inputs}
        return self._call_table(inputs)

    def _call_table(self, value):
        combiner = self.sequence_combiner
        if isinstance(value, tf.SparseTensor):
            value = tf.RaggedTensor.from_sparse(value)
        if isinstance(value, tf.RaggedTensor):
            if value.shape.rank == 3:
                value = value.merge_dims(1, 2)
            rows = self.embedding_lookup(value.values)
            if not combiner:
                return tf.RaggedTensor.from_row_splits(rows, value.row_splits)
            lengths = value.row_lengths()
            weights = tf.cast(combiner_weights(lengths, combiner), rows.dtype)
            segments = tf.repeat(tf.range(value.nrows()), lengths)
            return tf.math.unsorted_segment_sum(rows * weights[:, None], segments, value.nrows())
        value = tf.convert_to_tensor(value)
        if value.shape.rank and value.shape.rank > 1 and value.shape[-1] == 1:
            value = tf.squeeze(value, -1)
        out = self.embedding_lookup(value)
        if out.shape.rank > 2 and combiner:
            reduce = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max}
            if combiner == "sqrtn":
                return tf.reduce_sum(out, 1) / tf.sqrt(tf.cast(tf.shape(out)[1], out.dtype))
            out = reduce[combiner](out, axis=1)
        return out

    def __repr__(self):
        return f"TableHandle(name={self.name!r}, input_dim={self.input_dim}, dim={self.dim})"


def bind_table_weights(block) -> None:
    """After the block's build: each table's shards on this rank become its handle's weights
    (Keras counts, trains and freezes them with the handle; the block keeps tracking them)."""
    by_table: dict = {}
    for shard in block.plan.shards_on(block.rank):
        by_table.setdefault(shard.table, []).append(block.backend.shard_variable(shard)[0])
    # a dynamic table's default row trains and freezes with its rows
    for table, row in getattr(block.backend, "defaults", {}).items():
        by_table.setdefault(table, []).append(row)
    handles = block.handles_by_name()
    for table, variables in by_table.items():
        keras_compat.hand_over_weights(block, handles[table], variables)


def trainable_config(block, option):
    """``trainable`` for the block's config: ``option`` (as constructed) while the tables'
    flags are as it made them, else the flags now (after ``freeze_blocks``), by table."""
    flags = {name: bool(h.trainable) for name, h in block.handles_by_name().items()}
    if not block.trainable:
        return False
    if flags == dict(block.table_trainable):
        return option
    return True if all(flags.values()) else flags


class TableAccessMixin:
    """``block[name]``, ``embedding_tables``, iteration and ``select_by_*`` over tables."""

    def handles_by_name(self) -> dict:
        cache = self.__dict__.get("_mmde_handles")
        if cache is None:
            cache = {t.name: TableHandle(self, t.name) for t in self.tables}
            object.__setattr__(self, "_mmde_handles", cache)  # untracked (see TableHandle)
        return cache

    def untracked_sublayers(self) -> list:
        """The table handles, as Keras and Merlin walk the block (see compat.keras)."""
        return list(self.__dict__.get("_mmde_handles", {}).values())

    @property
    def embedding_tables(self) -> dict:
        return dict(self.handles_by_name())

    parallel_layers = embedding_tables
    parallel_dict = embedding_tables

    @property
    def parallel_values(self) -> list:
        return list(self.handles_by_name().values())

    layers = parallel_values  # mm.Embeddings (a ParallelBlock) lists its tables as ``layers``

    def __getitem__(self, name):
        handles = self.handles_by_name()
        if name in handles:
            return handles[name]
        for f in self.features:
            if f.name == name:
                return handles[f.table]
        raise KeyError(
            f"No table or feature named {name!r}. Tables: {sorted(handles)}; "
            f"features: {[f.name for f in self.features]}"
        )

    def __iter__(self):
        return iter(self.parallel_values)

    def __contains__(self, name):
        return name in self.handles_by_name() or any(f.name == name for f in self.features)

    def select_by_name(self, name):
        if name == self.name:
            return self
        return self.handles_by_name().get(name)

    def select_by_tag(self, tags):
        """The features tagged with any of ``tags``: this block when that is all of them,
        None when none, else a :class:`~merlin_models_de.block.views.FeatureSelection` view (the
        lookups stay collective: the view runs the whole block)."""
        return self.select_by_names_view(self.schema.select_by_tag(tags).column_names)

    def select_by_names_view(self, features):
        features = [c for c in self.schema.column_names if c in set(features)]
        if not features:
            return None
        if len(features) == len(self.schema.column_names):
            return self
        return FeatureSelection(self, features)

    def select_by_names(self, names) -> list:
        missing = [n for n in names if n not in self.handles_by_name()]
        if missing:
            raise ValueError(
                f"Given names {missing} are not tables of {self.name}. "
                f"Tables: {sorted(self.handles_by_name())}"
            )
        return [self.handles_by_name()[n] for n in names]
