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


# What a rank can still get: in a container or a scheduler's job the kernel kills at the
# cgroup's limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``, of its cgroup or any
# above it), long before the host runs out.
CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 says "no limit" with the largest page multiple below 2**63
_NO_LIMIT = 2**62
# per cgroup version: the files of its limit, its usage, and the line of memory.stat that
# counts the file cache the kernel drops before it kills (not memory a rank is using)
_FILES = {
    2: ("memory.max", "memory.current", "inactive_file"),
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
}


def available_bytes(cgroup_root: str = CGROUP_ROOT, membership: str = "/proc/self/cgroup"):
    """The bytes this process can still get: the smaller of the host's available memory and
    its cgroup's headroom (:func:`cgroup_headroom_bytes`); None when neither is known."""
    known = [
        v
        for v in (available_memory_bytes(), cgroup_headroom_bytes(cgroup_root, membership))
        if v is not None
    ]
    return min(known, default=None)


def cgroup_headroom_bytes(root: str = CGROUP_ROOT, membership: str = "/proc/self/cgroup"):
    """What the memory cgroup of the process whose ``/proc/<pid>/cgroup`` is ``membership``
    can still give, under the cgroup file system mounted at ``root``: the smallest, over it
    and every cgroup above it with a limit, of the limit minus the usage (the droppable file
    cache not counted as used). None without a limit, or where cgroups are not readable."""
    try:
        with open(membership, encoding="ascii") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    found = _memory_cgroup(root, lines)
    if found is None:
        return None
    version, mount, path = found
    headrooms = []
    while True:
        headroom = _headroom(os.path.join(mount, path.lstrip("/")), version)
        if headroom is not None:
            headrooms.append(headroom)
        if path in ("", "/"):
            return min(headrooms, default=None)
        path = os.path.dirname(path)


def _memory_cgroup(root: str, lines):
    """``(version, mount of the memory hierarchy, the process's cgroup in it)`` or None."""
    for _, controllers, path in lines:  # cgroup v1 (also in a hybrid with v2 beside it)
        if "memory" in controllers.split(",") and os.path.isdir(os.path.join(root, "memory")):
            return 1, os.path.join(root, "memory"), _visible(os.path.join(root, "memory"), path)
    try:
        with open(os.path.join(root, "cgroup.controllers"), encoding="ascii") as f:
            unified = "memory" in f.read().split()
    except OSError:
        unified = False
    for hierarchy, controllers, path in lines:
        if unified and hierarchy == "0" and controllers == "":
            return 2, root, _visible(root, path)
    return None


def _visible(mount: str, path: str) -> str:
    """``path``, or "/" when it is not below ``mount`` (a cgroup namespace shows the
    process's own cgroup as the root)."""
    return path if os.path.isdir(os.path.join(mount, path.lstrip("/"))) else "/"


def _headroom(directory: str, version: int):
    """Limit minus usage (droppable cache not counted) of one cgroup; None without a limit."""
    limit_file, usage_file, cache_line = _FILES[version]
    try:
        with open(os.path.join(directory, limit_file), encoding="ascii") as f:
            text = f.read().strip()
        if text == "max" or int(text) >= _NO_LIMIT:
            return None
        with open(os.path.join(directory, usage_file), encoding="ascii") as f:
            usage = int(f.read())
    except (OSError, ValueError):
        return None
    try:
        with open(os.path.join(directory, "memory.stat"), encoding="ascii") as f:
            stats = dict(line.split(None, 1) for line in f if " " in line)
        cache = int(stats.get(cache_line, 0))
    except (OSError, ValueError):
        cache = 0
    return max(0, int(text) - max(0, usage - cache))


def check_fits(plan, dtype_bytes: int, ranks_per_host: int, host_bytes: int | None) -> None:
    """Raises MemoryError naming the busiest rank, its largest table and the bytes, when that
    rank's shards alone (``dtype_bytes`` an element, and the key maps of dynamic tables)
    exceed ``host_bytes / ranks_per_host``.

    The count is the planner's (``ShardingPlan.rank_bytes``) without optimizer state: the
    block is built before the model is compiled, so the optimizer is not known yet. It
    refuses only what no optimizer can fit; ``mmde-plan``'s peak model counts the state and
    the copies a start makes."""
    if not host_bytes:
        return
    budget = host_bytes // max(1, ranks_per_host)
    per_rank = [plan.rank_bytes(r, "sgd", dtype_bytes) for r in range(plan.world_size)]
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
