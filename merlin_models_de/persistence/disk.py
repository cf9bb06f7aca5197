"""Disk space and write failures: say which file, which rank, and why.

A short write (a full disk) used to surface as NumPy's ``OSError: 480000 requested and 262112
written``: no file, no rank, no cause. Writes go through Python's file objects, whose errors
keep their errno, and :func:`write_failure` turns them into an ``OSError`` naming the file,
the rank and the cause (``No space left on device``). Before a save, :func:`check_free_space`
compares what the new checkpoint needs with what the file system reports as free.

Example:
    >>> human_bytes(3 * 2**20)
    '3.0 MiB'
"""

from __future__ import annotations

import errno as errno_codes
import os


def human_bytes(n: int) -> str:
    """``n`` bytes in B / KiB / MiB / GiB / TiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _rank() -> int:
    from merlin_models_de import comm

    return comm.rank()


def write_failure(path: str, exc: OSError) -> OSError:
    """An ``OSError`` (same errno) naming ``path``, this rank and the cause of ``exc``."""
    code = exc.errno
    cause = exc.strerror or str(exc)
    if code is not None:
        cause = f"{os.strerror(code)} ({errno_codes.errorcode.get(code, code)})"
    return OSError(code, f"Cannot write {path} on rank {_rank()}: {cause}")


def free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged writer may still use below ``directory`` (its nearest existing
    parent); None when the file system does not say."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        stat = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    if stat.f_frsize <= 0 or stat.f_blocks == 0:  # pseudo file systems report nothing
        return None
    return stat.f_bavail * stat.f_frsize


def check_free_space(directory: str, needed: int, what: str) -> None:
    """Raises ``OSError(ENOSPC)`` before writing when ``directory``'s file system reports
    less free space than ``needed`` bytes, naming both; no check where it reports nothing."""
    free = free_bytes(directory)
    if free is not None and needed > free:
        raise OSError(
            errno_codes.ENOSPC,
            f"Not enough free space in {directory} for {what} (checked on rank "
            f"{_rank()}): it needs {human_bytes(needed)} ({needed} bytes), the file "
            f"system has {human_bytes(free)} ({free} bytes) free. Free some space "
            f"or save elsewhere. Received: needed={needed}, free={free}",
        )


def npy_bytes(shape, itemsize: int) -> int:
    """Size of an ``.npy`` file of that shape (data plus a header of at most 4 KiB)."""
    count = 1
    for n in shape:
        count *= int(n)
    return count * itemsize + 4096
