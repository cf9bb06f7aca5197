"""Predicted peak resident memory of one rank: what the plan command prints, what the capacity
search (``python -m merlin_models_de.apps.bench.capacity``) checks against the measured peak.

A rank's peak is its runtime (TensorFlow, Merlin, Horovod, the dense layers and the input
pipeline at the commands' batch: measured, not derived), plus its tables with their optimizer
slots (row-wise Adagrad's: one value per row; tables stored in 16 bits take 2 bytes an
element, their optimizer state stays float32), resident :data:`ALLOCATOR_OVERHEAD` above
their bytes. Where a rank holds every table and Horovod averages their gradients (Merlin's
data-parallel training: ``sparse_as_dense``), add :data:`DENSE_GRADIENT_COPIES` of the
tables (the dense gradient, the allreduce's staging and what the allocator keeps of them).
The block's gradients stay sparse (the rows a batch looked up): no table-sized term.

Where TensorFlow turns oneDNN on (x86 CPUs with AVX512-VNNI or newer), its CPU allocator keeps
what a run frees as a pool of its own, resident until the process ends. A table drawn whole by
Keras' uniform holds three copies of itself at once (``backends/shard_init.BLOCK_BYTES``), on
top of the tables made before it, and part of what it freed stays:
:data:`DRAWN_WHOLE_KEPT` of the largest such table for the rest of the run. ``mm.Embeddings``
and one process draw tables whole; on several ranks the block draws a large shard a block of
rows at a time (one copy and a block's temporaries).

The constants are fitted on the capacity searches' runs (docs/benchmarks.md, "Capacity"):
every rank of every sharded run that trained (2 and 4 ranks, float32 and 16-bit tables,
Adagrad and row-wise Adagrad) within 3%, one process within 2%, data parallel's busiest rank
within 3.3% (its other rank, holding the same, peaked up to 21% lower).
"""

from __future__ import annotations

from merlin_models_de.planner.types import ShardingPlan, ShardingType, held_bytes

# Fitted on the capacity searches' runs (TF 2.12 CPU, oneDNN on, batch 512, 20 steps of the
# DLRM command): what a rank holds besides its tables and their state, the same at every scale
RUNTIME_BYTES = int(0.78 * 2**30)
# resident bytes above a large allocation's own (fitted: 4.95%; one 704 MB variable alone
# measured 4.7% for Adagrad's slot, 5.9% for a zero-filled table)
ALLOCATOR_OVERHEAD = 0.05
# copies of the tables that allreducing their gradients dense adds (gradient, staging and the
# allocator's pool of them; fitted on the busiest rank at 0.5x and 0.75x Criteo: 2.4)
DENSE_GRADIENT_COPIES = 2.4
# of the largest table drawn whole, what the allocator keeps after the draw (fitted: 0.46)
DRAWN_WHOLE_KEPT = 0.5


def rank_peak_bytes(
    elements: int,
    optimizer: str,
    dtype_bytes: int = 4,
    dense_gradients: bool = False,
    runtime: int = RUNTIME_BYTES,
    drawn_whole: int = 0,
    rows: int = 0,
    table_bytes: int | None = None,
    overhead: float = ALLOCATOR_OVERHEAD,
) -> int:
    """Peak bytes of a rank holding ``elements`` table parameters in ``rows`` rows trained
    with ``optimizer`` (its slots are copies, its row-wise state a value per row), tables
    and state resident ``overhead`` above their bytes; ``dense_gradients``: the tables'
    gradients are allreduced dense (:data:`DENSE_GRADIENT_COPIES` more copies);
    ``drawn_whole``: the elements of the largest table initialized in one draw (two more
    copies of it while drawn, the others made; :data:`DRAWN_WHOLE_KEPT` of it after);
    ``table_bytes``: bytes of a stored table element (2: 16-bit tables; None: ``dtype_bytes``,
    which optimizer state and draws keep)."""
    tables, state = held_bytes(elements, rows, optimizer, dtype_bytes, table_bytes)
    dense = elements * dtype_bytes * DENSE_GRADIENT_COPIES if dense_gradients else 0
    drawn = drawn_whole * dtype_bytes
    training = (1 + overhead) * (tables + state) + dense + DRAWN_WHOLE_KEPT * drawn
    initializing = with_two_copies(tables, drawn, overhead)
    return runtime + int(max(training, initializing))


def with_two_copies(held: int, largest: int, overhead: float = ALLOCATOR_OVERHEAD) -> float:
    """Bytes resident while ``held`` bytes sit ``overhead`` above their own and two more
    copies of a ``largest``-byte piece exist at once: a table drawn whole (Keras' uniform,
    beside the tables made before it), or the part a streaming restore reads and converts
    to a tensor (``elastic/memory.py``)."""
    return (1 + overhead) * held + 2 * largest


def plan_peak_bytes(
    plan: ShardingPlan,
    optimizer: str,
    dtype_bytes: int = 4,
    runtime: int = RUNTIME_BYTES,
    table_bytes: int | None = None,
    overhead: float = ALLOCATOR_OVERHEAD,
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
            overhead=overhead,
        )
        + int((1 + overhead) * replicated_extra(plan, rank, dtype_bytes, table_bytes))
        + plan.key_map_bytes(rank)  # a dynamic table's key map, beside its rows
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
    tables,
    optimizer: str,
    world_size: int = 1,
    dtype_bytes: int = 4,
    runtime: int = RUNTIME_BYTES,
    overhead: float = ALLOCATOR_OVERHEAD,
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
        overhead=overhead,
    )
