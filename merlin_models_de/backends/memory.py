"""Refuse, before allocating, tables that cannot fit the memory a rank has (pure Python).

Every rank checks the busiest rank of the plan (the plan is the same everywhere) against its
own host's physical memory shared by the ranks on that host, so on homogeneous hosts all ranks
refuse together, before any collective. Only host memory is checked: on GPUs the tables live
in device memory, which TensorFlow reports only once allocated, so there the check is skipped.

Example:
    >>> check_fits(plan, dtype_bytes=4, ranks_per_host=2, host_bytes=24 * 2**30)  # doctest: +SKIP
"""

from __future__ import annotations

import os

from merlin_models_de.tables import human_bytes


def host_memory_bytes() -> int | None:
    """Physical memory of this host in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """Memory this host can still give (``MemAvailable``: free memory and caches it can drop),
    in bytes; None where the OS does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_fits(plan, dtype_bytes: int, ranks_per_host: int, host_bytes: int | None) -> None:
    """Raises MemoryError naming the busiest rank, its largest table and the bytes, when that
    rank's shards alone exceed ``host_bytes / ranks_per_host``."""
    if not host_bytes:
        return
    budget = host_bytes // max(1, ranks_per_host)
    per_rank = [
        sum(s.elements for s in plan.shards_on(r)) * dtype_bytes for r in range(plan.world_size)
    ]
    busiest = max(range(plan.world_size), key=lambda r: per_rank[r])
    if per_rank[busiest] <= budget:
        return
    largest = max(plan.shards_on(busiest), key=lambda s: s.elements)
    table = plan.table(largest.table)
    raise MemoryError(
        f"Rank {busiest} would hold {human_bytes(per_rank[busiest])} of embedding tables "
        f"(largest: table '{table.name}', {human_bytes(largest.elements * dtype_bytes)} on that "
        f"rank), more than the {human_bytes(budget)} of memory each of the {ranks_per_host} "
        f"rank(s) on this host has. Use more ranks, a smaller dim, or row / column slicing. "
        f"Received: table '{table.name}' rows={table.rows} dim={table.dim}"
    )
