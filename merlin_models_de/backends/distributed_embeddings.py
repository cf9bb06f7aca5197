"""NVIDIA distributed-embeddings (DE) as a backend: its ``DistributedEmbedding`` runs the plan.

The block's tables become DE's list of (unbuilt) ``Embedding`` layers in plan order, shared
tables go through DE's ``input_table_map``, and the block's placement options go to DE's
strategy. DE then places the tables itself; :func:`de_placement` reads its placement back and
the backend refuses to run when it differs from the block's plan (our planner reproduces DE's
strategies, so a difference is a bug, not a choice). One extra small exchange per step carries
each rank's batch size and bad-id count, so bad input fails on every rank at once as it does
with the horovod backend (DE itself checks neither).

Supported: one-hot features (dense ids), DE's three strategies (:data:`NVIDIA_STRATEGIES`; the
planner's ``work_balanced`` is ours only and raises ValueError), column / row slices,
data-parallel tables, shared tables. Not supported (DE's dp-input path takes dense ids only, and it has no
``sqrtn``): multi-hot features; they raise NotImplementedError naming the feature.

Example:
    >>> block = DistributedEmbeddings(schema, dim=16, backend="distributed-embeddings")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.base import EmbeddingBackend
from merlin_models_de.planner.strategies import NVIDIA_STRATEGIES
from merlin_models_de.planner.types import MODEL_PARALLEL, ShardingPlan, ShardingType

_MODEL_PARALLEL = "model_parallel"  # DE merges a table's slices on a rank: no table/column split


def de_placement(strategy, table_names, world_size: int) -> list[dict]:
    """DE's placement as ``[{table: (kind, cols or rows)}]`` per rank.

    ``strategy`` is DE's ``DistEmbeddingStrategy`` (pure Python; built from the table configs).
    Model-parallel entries carry the columns the rank holds (slices that land on one rank are
    merged by DE), row slices the rows, data-parallel tables their full width.
    """
    dp, col, row = strategy.table_groups
    out: list[dict] = [{} for _ in range(world_size)]
    for r in range(world_size):
        for t in dp:
            out[r][table_names[t]] = (ShardingType.DATA_PARALLEL.value, None)
        for i, t in enumerate(row):
            out[r][table_names[t]] = (
                ShardingType.ROW_WISE.value,
                strategy.row_sliced_configs[r][i]["input_dim"],
            )
    if col:
        for r in range(world_size):
            configs, local_map = strategy.local_configs[r], strategy.local_maps[r]
            for k, g in zip(strategy.input_ids_list[r], local_map):
                table = table_names[col[strategy.map_groups[1][k]]]
                out[r][table] = (_MODEL_PARALLEL, configs[g]["output_dim"])
    return out


def plan_placement(plan: ShardingPlan) -> list[dict]:
    """The block plan in :func:`de_placement`'s form."""
    out: list[dict] = [{} for _ in range(plan.world_size)]
    for s in plan.shards:
        if s.kind is ShardingType.DATA_PARALLEL:
            out[s.rank][s.table] = (s.kind.value, None)
        elif s.kind is ShardingType.ROW_WISE:
            out[s.rank][s.table] = (s.kind.value, s.rows)
        elif s.kind in MODEL_PARALLEL:
            out[s.rank][s.table] = (_MODEL_PARALLEL, s.cols)
    return out


def de_strategy(plan: ShardingPlan, tables, input_table_map=None):
    """DE's ``DistEmbeddingStrategy`` for ``plan``'s tables and options (no Horovod needed)."""
    from distributed_embeddings.python.layers import dist_model_parallel as dmp

    return dmp.DistEmbeddingStrategy(
        _embeddings(tables, lambda name: "uniform"),
        plan.world_size,
        **_de_options(plan, input_table_map),
    )


def _embeddings(tables, initializer):
    from distributed_embeddings.python.layers.embedding import Embedding

    return [
        Embedding(t.rows, t.dim, embeddings_initializer=initializer(t.name), name=t.name)
        for t in tables
    ]


def _de_options(plan, input_table_map):
    options = dict(plan.options)
    single = plan.world_size == 1  # DE drops row slices and data-parallel tables on one rank
    return dict(
        strategy=plan.strategy,
        input_table_map=input_table_map,
        column_slice_threshold=options.get("column_slice_threshold"),
        row_slice_threshold=None if single else options.get("row_slice_threshold"),
        data_parallel_threshold=None if single else options.get("data_parallel_threshold"),
    )


class DistributedEmbeddingsBackend(EmbeddingBackend):
    """Drives DE's ``DistributedEmbedding`` (see the module docstring)."""

    name = "distributed-embeddings"

    def __init__(self, plan: ShardingPlan, features, rank: int, **options):
        if plan.strategy not in NVIDIA_STRATEGIES:
            raise ValueError(
                f"backend='distributed-embeddings' places tables with one of its own "
                f"strategies {list(NVIDIA_STRATEGIES)}; use backend='horovod' for the others. "
                f"Received: strategy={plan.strategy!r}"
            )
        super().__init__(plan, features, rank, **options)  # options: see the base class
        self.names = [t.name for t in plan.tables]
        self.input_table_map = [self.names.index(f.table) for f in self.features]
        self.de: Any = None

    @classmethod
    def unsupported(cls, features, exchange_dtype=None, table_dtype=None):
        if table_dtype is not None and table_dtype != "float32":
            return (
                "backend='distributed-embeddings' stores tables in float32 only; use "
                "backend='horovod' (or 'auto') for 16-bit tables. Received: "
                f"table_dtype={table_dtype!r}"
            )
        if exchange_dtype is not None:
            return (
                "backend='distributed-embeddings' exchanges rows in the block's dtype only; "
                "use backend='horovod' (or 'auto') for a narrower exchange. Received: "
                f"exchange_dtype={exchange_dtype!r}"
            )
        for f in features:
            if f.multi_hot:
                return (
                    f"Multi-hot features are not supported by "
                    f"backend='distributed-embeddings' (its data-parallel input path takes "
                    f"dense one-hot ids only); use backend='horovod'. Received: multi-hot "
                    f"feature '{f.name}' (sequence_combiner={f.combiner!r})"
                )
        return None

    # ---- variables ------------------------------------------------------------------------

    def create_variables(self, layer, initializer, trainable: bool) -> None:
        """Creates DE's layer and its variables on this rank."""
        from distributed_embeddings.python.layers import dist_model_parallel as dmp

        comm.hvd()  # initialized before DE asks for the world size
        de = dmp.DistributedEmbedding(
            _embeddings(self.plan.tables, initializer),
            **_de_options(self.plan, self.input_table_map),
            dp_input=True,
            name="de",
        )
        if self.plan.world_size > 1:
            theirs, ours = (
                de_placement(de.strategy, self.names, self.plan.world_size),
                plan_placement(self.plan),
            )
            if theirs != ours:
                raise RuntimeError(
                    f"distributed-embeddings placed the tables differently from "
                    f"the block's plan (a bug; please report it). DE: {theirs}; "
                    f"plan: {ours}"
                )
        de.build(None)  # a shape would make DE allgather batch sizes in build
        de.trainable = trainable
        self.de = de

    def sublayers(self) -> list:
        return [self.de] if self.de is not None else []

    def local_variables(self) -> list:
        if self.de is None:
            return []
        return [l.embeddings for l in self.de.local_embedding_layers + self.de.row_layers]

    def shard_variable(self, shard):
        s, t = self.de.strategy, self.names.index(shard.table)
        dp, col, row = s.table_groups
        if t in dp:
            return self.de.dp_layers[dp.index(t)].embeddings, 0
        if t in row:
            return self.de.row_layers[row.index(t)].embeddings, 0
        m = s.table_ids[self.rank].index(col.index(t))
        for g, group in enumerate(s.local_group_list[self.rank]):
            if m in group:
                offset = s.local_weight_offsets[self.rank][g][group.index(m)]
                return self.de.local_embedding_layers[g].embeddings, offset
        raise KeyError(f"Shard not on rank {self.rank}. Received: {shard}")

    # ---- one step ---------------------------------------------------------------------------

    def exchange_and_lookup(
        self, inputs, batch, header, check, training=False, waiting=None, key_updates=None
    ) -> list:
        del waiting  # DE's exchanges run their backward in the tape (DistributedGradientTape)
        del key_updates  # DE runs no dynamic table (unsupported)
        checks = self.exchange_header(header, check)  # DE's own exchanges take no header
        with tf.control_dependencies(checks):
            ids = [tf.identity(tf.reshape(i, [-1])) for i, _ in inputs]
        return list(self.de(ids))
