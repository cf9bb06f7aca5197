"""Predicted peak resident memory of one rank: what the plan command prints, what the capacity
search (``python -m merlin_models_de.apps.bench.capacity``) checks against the measured peak.

A rank's peak is its runtime (TensorFlow, Merlin, Horovod, the dense layers and the input
pipeline at the commands' batch: measured, not derived), its tables with their optimizer
slots (row-wise Adagrad's: one value per row; tables stored in 16 bits take 2 bytes an
element, their optimizer state stays float32) and, where a rank holds every table and Horovod averages their gradients (Merlin's
data-parallel training: ``sparse_as_dense``), a dense gradient of every table and a quarter
more for the allreduce's staging (fitted: 1.17-1.25 copies measured at 0.5x-1x Criteo). The
block's gradients stay sparse (the rows a batch looked up): no table-sized term.

Initialization can set the peak instead: a table drawn whole by Keras' uniform holds three
copies of itself at once (``backends/shard_init.BLOCK_BYTES``), on top of the tables made
before it. ``mm.Embeddings`` and one process draw tables whole; on several ranks the block
draws a large shard a block of rows at a time (one copy and a block's temporaries). Before
that, on 4 ranks with one 30M-row table each, every rank peaked at runtime + 3 copies of it.
"""

from __future__ import annotations

from merlin_models_de.planner.types import (
    ShardingPlan,
    ShardingType,
    optimizer_slots,
    row_slots,
)

# Fitted on the capacity search's one-process runs (docs/benchmarks.md, "Capacity"): the DLRM
# command's peak RSS, TF 2.12 CPU, batch 512, 20 steps, less its tables with Adagrad's slots,
# is 0.74 GiB at every scale (0.5x-3x Criteo); the sharded ranks' peaks then fall within 1%.
RUNTIME_BYTES = int(0.74 * 2**30)
# copies of the tables that allreducing their gradients dense adds (gradient + staging)
DENSE_GRADIENT_COPIES = 1.25


def rank_peak_bytes(
    elements: int,
    optimizer: str,
    dtype_bytes: int = 4,
    dense_gradients: bool = False,
    runtime: int = RUNTIME_BYTES,
    drawn_whole: int = 0,
    rows: int = 0,
    table_bytes: int | None = None,
) -> int:
    """Peak bytes of a rank holding ``elements`` table parameters in ``rows`` rows trained
    with ``optimizer`` (its slots are copies, its row-wise state a value per row);
    ``dense_gradients``: the tables' gradients are allreduced dense
    (:data:`DENSE_GRADIENT_COPIES` more copies); ``drawn_whole``: the elements of the largest
    table initialized in one draw (two more copies of it while drawn, the others made);
    ``table_bytes``: bytes of a stored table element (2: 16-bit tables; None: ``dtype_bytes``,
    which optimizer state and draws keep)."""
    stored = dtype_bytes if table_bytes is None else table_bytes
    copies = optimizer_slots(optimizer) + (DENSE_GRADIENT_COPIES if dense_gradients else 0)
    row_state = rows * row_slots(optimizer) * dtype_bytes
    training = runtime + elements * stored + int(elements * dtype_bytes * copies) + row_state
    initializing = runtime + elements * stored + 2 * drawn_whole * dtype_bytes
    return max(training, initializing)


def plan_peak_bytes(
    plan: ShardingPlan,
    optimizer: str,
    dtype_bytes: int = 4,
    runtime: int = RUNTIME_BYTES,
    table_bytes: int | None = None,
) -> list[int]:
    """Predicted peak bytes of every rank of ``plan`` (the block's shards), in rank order
    (one process draws its tables whole, several ranks by blocks of rows); ``table_bytes``:
    see :func:`rank_peak_bytes` (replicated tables keep ``dtype_bytes``)."""

    def drawn_whole(rank):
        shards = plan.shards_on(rank) if plan.world_size == 1 else []
        return max((s.elements for s in shards), default=0)

    return [
        rank_peak_bytes(
            plan.rank_elements(rank),
            optimizer,
            dtype_bytes,
            runtime=runtime,
            drawn_whole=drawn_whole(rank),
            rows=sum(s.rows for s in plan.shards_on(rank)),
            table_bytes=table_bytes,
        )
        + replicated_extra(plan, rank, dtype_bytes, table_bytes)
        for rank in range(plan.world_size)
    ]


def replicated_extra(plan, rank: int, dtype_bytes: int, table_bytes: int | None) -> int:
    """Bytes a rank's replicated tables take beyond their 16-bit estimate (they keep the
    block's dtype); 0 when tables are stored in ``dtype_bytes``."""
    if table_bytes is None or table_bytes == dtype_bytes:
        return 0
    replicated = sum(
        s.elements for s in plan.shards_on(rank) if s.kind is ShardingType.DATA_PARALLEL
    )
    return replicated * (dtype_bytes - table_bytes)


def replicated_peak_bytes(
    tables, optimizer: str, world_size: int = 1, dtype_bytes: int = 4, runtime: int = RUNTIME_BYTES
) -> int:
    """Predicted peak bytes of a rank that holds every table whole (``mm.Embeddings``): one
    process, or each of ``world_size`` > 1 ranks of Merlin's data-parallel training.
    ``mm.Embeddings``' tables are not the block's: a row-wise optimizer keeps element-wise
    Adagrad state for them."""
    sizes = [t.rows * t.dim for t in tables]
    return rank_peak_bytes(
        sum(sizes),
        "adagrad" if optimizer == "rowwise_adagrad" else optimizer,
        dtype_bytes,
        dense_gradients=world_size > 1,
        runtime=runtime,
        drawn_whole=max(sizes, default=0),
        rows=sum(t.rows for t in tables),
    )
