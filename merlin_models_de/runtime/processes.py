"""What ``/proc`` says of a process on this host: its PID namespace and its state and start
time. The checkpoint lock (is its holder alive?) and the silent-rank message (is a peer
stopped?) both ask.

Example:
    >>> process_stat(os.getpid())[0] in ("R", "S")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import os


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[<inode>]``): a pid means something only in it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_stat(pid) -> tuple[str | None, int | None]:
    """``(state, start time in clock ticks since boot)`` of process ``pid`` (fields 3 and 22
    of ``/proc/<pid>/stat``); ``(None, None)`` when it is gone, ``("?", None)`` where the
    system does not say (no ``/proc``, an unreadable entry, a pid that is not one)."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the name, which may hold ")"
        return fields[0], int(fields[19])
    except FileNotFoundError:
        return (None, None) if os.path.exists("/proc/self/stat") else ("?", None)
    except (OSError, ValueError, IndexError, TypeError, OverflowError):
        return "?", None


__all__ = ["pid_namespace", "process_stat"]
