"""Will a reset to another world size fit? Asked before the new model exists (pure Python).

A lost host leaves the ranks that remain to hold its share of the tables. The reset builds the
model for the new world size and restores the last commit into it; a world too small for the
tables would be killed by the kernel's OOM killer part-way through, with no word of why. So the
reset first predicts, from the commit's manifest (its blocks' tables, placement strategy and
options, and the parts saved per table: the table and its optimizer slots), what each rank of
the new world will hold at its peak, and every rank refuses together when one host cannot give
it.

A rank's peak in a reset, over what it holds before (the old model is freed first):
- its shards with every saved part (table and slots) once restored, and a dynamic table's
  key map (and candidates) as the planner counts it, plus the largest part's
  buffer a streaming restore reads (``restore_checkpoint(..., all_or_nothing=False)``) and its
  conversion to a tensor when assigned (two copies: measured, tests/unit/test_elastic_memory.py);
- or, while initializing, its tables plus two more copies of the largest table a single rank
  draws whole (Keras' uniform; ``planner/memory.py``);
- either way its tables and slots resident ``ALLOCATOR_OVERHEAD`` above their bytes, as in
  the plan's memory model (``planner/memory.py``).

What a rank can still get is ``backends.memory.available_bytes``: the host's available memory,
or less under a cgroup's limit.

Example:
    >>> need = reset_peak_bytes(manifest, world_size=1)            # doctest: +SKIP
    >>> problem = reset_problem(manifest, 1, rank=0, ranks_on_host=1, available=8 * 2**30)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os

import numpy as np

from merlin_models_de import planner
from merlin_models_de.dynamic.rehome import candidate_rows
from merlin_models_de.planner.memory import ALLOCATOR_OVERHEAD, with_two_copies
from merlin_models_de.planner.types import KEY_MAP_BYTES_PER_ROW
from merlin_models_de.tables import human_bytes

# the largest world size the advice in the refusal looks for (re-planning is cheap up to here;
# every rank waits for the slowest in the check's agreement)
MAX_SUGGESTED_WORLD = 64


def _replanned(block, world_size: int):
    """The saved block's plan made again for ``world_size`` with its own strategy and options."""
    saved = block.plan
    return planner.plan(saved.tables, world_size, saved.strategy, **dict(saved.options))


def reset_peak_bytes(manifest, world_size: int, overhead: float = ALLOCATOR_OVERHEAD) -> list[int]:
    """Predicted bytes each rank of ``world_size`` adds in a reset from ``manifest``'s commit
    (see the module doc), in rank order; restored parts resident ``overhead`` above their
    bytes."""
    restored = [0] * world_size
    tables = [0] * world_size
    buffer = [0] * world_size
    largest_drawn = [0] * world_size
    for block in manifest.blocks:
        plan = _replanned(block, world_size)
        for rank in range(world_size):
            for shard in plan.shards_on(rank):
                parts = block.parts[shard.table]
                sizes = [math.prod(p.shape(shard)) * np.dtype(p.dtype).itemsize for p in parts]
                restored[rank] += sum(sizes)
                tables[rank] += sizes[0]
                if shard.table in block.maps:  # a dynamic table's key map and candidates
                    option = block.maps[shard.table].option
                    slots = shard.rows + candidate_rows(option, shard.rows)
                    restored[rank] += KEY_MAP_BYTES_PER_ROW * slots
                buffer[rank] = max(buffer[rank], max(sizes))
                if world_size == 1:
                    largest_drawn[rank] = max(largest_drawn[rank], sizes[0])
    return [
        math.ceil(
            max(
                with_two_copies(restored[r], buffer[r], overhead),
                with_two_copies(tables[r], largest_drawn[r], overhead),
            )
        )
        for r in range(world_size)
    ]


def _smallest_fitting_world(manifest, world_size: int, ranks_on_host: int, available: int):
    """The smallest world size above ``world_size`` whose busiest rank fits ``available``
    bytes shared by ``ranks_on_host`` (the host as it is now), or None."""
    for n in range(world_size + 1, MAX_SUGGESTED_WORLD + 1):
        try:
            need = max(reset_peak_bytes(manifest, n))
        except ValueError:  # a table with fewer rows than ranks to row-slice it over
            return None
        if need <= available // max(1, ranks_on_host):
            return n
    return None


def reset_problem(
    manifest, world_size: int, rank: int, ranks_on_host: int, available: int | None
) -> str | None:
    """Why this rank cannot take its part of a reset to ``world_size`` ranks, or None.

    ``available``: the bytes this host can still give (None: unknown, not checked), shared
    by the ``ranks_on_host`` ranks of this host.
    """
    if available is None:
        return None
    need = reset_peak_bytes(manifest, world_size)[rank]
    share = available // max(1, ranks_on_host)
    if need <= share:
        return None
    enough = _smallest_fitting_world(manifest, world_size, ranks_on_host, available)
    advice = (
        f"at least {enough} ranks, {ranks_on_host} a host with memory like this one, would "
        f"fit (horovodrun --min-np {enough} waits for them)"
        if enough
        else f"no world of up to {MAX_SUGGESTED_WORLD} ranks like this one fits"
    )
    return (
        f"An elastic reset to {world_size} rank(s) would need {human_bytes(need)} on rank "
        f"{rank} (its share of the tables with their optimizer slots, as committed at step "
        f"{manifest.step}), more than the {human_bytes(share)} of memory available to each of "
        f"the {ranks_on_host} rank(s) on its host: the job stops rather than be killed "
        f"part-way. The commit {os.path.dirname(manifest.path)} is intact; resume it on more ranks: {advice}. "
        f"Received: world_size={world_size}"
    )
