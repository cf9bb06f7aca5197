"""Predicted peak resident memory of one rank: what the plan command prints, what the capacity
search (``python -m merlin_models_de.apps.capacity``) checks against the measured peak.

A rank's peak is its runtime (TensorFlow, Merlin, Horovod, the dense layers and the input
pipeline at the commands' batch: measured, not derived), its tables with their optimizer
slots and, where a rank holds every table and Horovod averages their gradients (Merlin's
data-parallel training: ``sparse_as_dense``), a dense gradient of every table and a quarter
more for the allreduce's staging (fitted: 1.17-1.25 copies measured at 0.5x-1x Criteo). The
block's own shards are initialized one at a time and their gradients stay sparse (the rows a
batch looked up), so neither adds a table-sized term.
"""
from __future__ import annotations

from merlin_models_de.planner.types import ShardingPlan, optimizer_slots

# Fitted on the capacity search's one-process runs (docs/benchmarks.md, "Capacity"): the DLRM
# command's peak RSS, TF 2.12 CPU, batch 512, 20 steps, less its tables with Adagrad's slots,
# is 0.74 GiB at every scale (0.5x-3x Criteo); the sharded ranks' peaks then fall within 1%.
RUNTIME_BYTES = int(0.74 * 2**30)
# copies of the tables that allreducing their gradients dense adds (gradient + staging)
DENSE_GRADIENT_COPIES = 1.25


def rank_peak_bytes(elements: int, optimizer: str, dtype_bytes: int = 4,
                    dense_gradients: bool = False, runtime: int = RUNTIME_BYTES) -> int:
    """Peak bytes of a rank holding ``elements`` table parameters trained with ``optimizer``
    (its slots are copies); ``dense_gradients``: the tables' gradients are allreduced dense
    (:data:`DENSE_GRADIENT_COPIES` more copies)."""
    copies = 1 + optimizer_slots(optimizer) + (DENSE_GRADIENT_COPIES if dense_gradients else 0)
    return runtime + int(elements * dtype_bytes * copies)


def plan_peak_bytes(plan: ShardingPlan, optimizer: str, dtype_bytes: int = 4,
                    runtime: int = RUNTIME_BYTES) -> list[int]:
    """Predicted peak bytes of every rank of ``plan`` (the block's shards), in rank order."""
    return [rank_peak_bytes(plan.rank_elements(rank), optimizer, dtype_bytes, runtime=runtime)
            for rank in range(plan.world_size)]


def replicated_peak_bytes(tables, optimizer: str, world_size: int = 1, dtype_bytes: int = 4,
                          runtime: int = RUNTIME_BYTES) -> int:
    """Predicted peak bytes of a rank that holds every table whole (``mm.Embeddings``): one
    process, or each of ``world_size`` > 1 ranks of Merlin's data-parallel training."""
    return rank_peak_bytes(sum(t.rows * t.dim for t in tables), optimizer, dtype_bytes,
                           dense_gradients=world_size > 1, runtime=runtime)
