"""The commands' processes on 2 MB pages: glibc's allocator asked for transparent huge pages.

A training step reads and updates table rows at random: about one page per row, so on 4 KB
pages nearly every row costs a TLB miss, and in a virtual machine a miss walks two page
tables. glibc (2.35 and newer) marks the memory it maps for transparent huge pages when the
tunable ``glibc.malloc.hugetlb=1`` is set, which covers the tables, their optimizer slots
and the step's buffers alike. Tunables are read when a process starts, so a command started
without it starts itself again with it (``os.execve``: same process id, arguments and
descriptors), before TensorFlow or Horovod load. Nothing changes where the kernel's
transparent huge pages are off (``never``), glibc is not glibc or older, or ``GLIBC_TUNABLES``
already names the tunable (the user's own choice wins); ``--no-huge-pages`` keeps 4 KB pages.

Example:
    >>> relaunch_env({"PATH": "/bin"}, thp_mode="madvise", glibc=(2, 36))
    {'PATH': '/bin', 'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}
    >>> relaunch_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", (2, 36)) is None
    True
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
FIRST_GLIBC = (2, 35)  # the first glibc with the tunable


def thp_mode(path: str = THP_SETTING) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None
    where the kernel has none (not Linux, or built without them)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, ...] | None:
    """This Python's glibc as a tuple of ints, or None under another C library."""
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return None


def relaunch_env(env, thp_mode: str | None, glibc: tuple | None) -> dict | None:
    """The environment to start this process again with (``env`` plus the tunable), or None
    where that would change nothing or override the user's own setting."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if thp_mode in (None, "never") or glibc is None or glibc < FIRST_GLIBC:
        return None
    if TUNABLE in tunables:
        return None
    joined = f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1"
    return {**env, "GLIBC_TUNABLES": joined}


def relaunch_on_huge_pages() -> None:
    """Starts this command again with glibc's huge page tunable where :func:`relaunch_env`
    says so; returns only where it does not. Call it before TensorFlow loads."""
    env = relaunch_env(os.environ, thp_mode(), glibc_version())
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
