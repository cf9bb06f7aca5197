"""Predicted peak resident memory of one rank: what the plan command prints, what the capacity
search (``python -m merlin_models_de.apps.capacity``) checks against the measured peak.

A rank's peak is its runtime (TensorFlow, Merlin, Horovod, the dense layers and the input
pipeline: measured, not derived), its tables with their optimizer slots, and the transient of
table initialization: an initializer materializes a table's initial values before the variable
holds them, so the largest table (or shard) a rank builds is briefly there twice.
Gradients (rows a batch looked up) and exchange buffers are per-batch and small beside those
at the sizes where memory matters; the runtime constant absorbs them at the bench's batch.
"""
from __future__ import annotations

from merlin_models_de.planner.types import ShardingPlan, optimizer_slots

# Measured peak RSS of the DLRM command with tiny tables (Criteo capped at 1,000 rows, dim 16,
# batch 512, Adagrad) on TF 2.12 CPU: one process 1.27 GiB, a rank of 2 under horovodrun
# 1.33 GiB (capacity search of docs/benchmarks.md).
RUNTIME_BYTES = int(1.3 * 2**30)


def rank_peak_bytes(elements: int, largest: int, optimizer: str, dtype_bytes: int = 4,
                    runtime: int = RUNTIME_BYTES) -> int:
    """Peak bytes of a rank holding ``elements`` table parameters, the largest of its tables
    or shards ``largest`` elements, trained with ``optimizer`` (its slots are copies)."""
    tables = elements * dtype_bytes * (1 + optimizer_slots(optimizer))
    return runtime + tables + largest * dtype_bytes


def plan_peak_bytes(plan: ShardingPlan, optimizer: str, dtype_bytes: int = 4,
                    runtime: int = RUNTIME_BYTES) -> list[int]:
    """Predicted peak bytes of every rank of ``plan``, in rank order."""
    peaks = []
    for rank in range(plan.world_size):
        shards = plan.shards_on(rank)
        largest = max((s.elements for s in shards), default=0)
        peaks.append(rank_peak_bytes(sum(s.elements for s in shards), largest, optimizer,
                                     dtype_bytes, runtime))
    return peaks


def replicated_peak_bytes(tables, optimizer: str, dtype_bytes: int = 4,
                          runtime: int = RUNTIME_BYTES) -> int:
    """Predicted peak bytes of a rank that holds every table whole (``mm.Embeddings``: one
    process, or each rank of Merlin's data-parallel training)."""
    sizes = [t.rows * t.dim for t in tables]
    return rank_peak_bytes(sum(sizes), max(sizes, default=0), optimizer, dtype_bytes, runtime)
