"""Where a sharded checkpoint's files lie: the names of its directories and files, ``latest``.

Layout of a checkpoint directory::

    latest                               name of the newest complete checkpoint
    .lock                                the writer's lock while a save runs (see lock.py)
    ckpt-<step>[-<k>]/manifest.json      what is where (see manifest.py)
    ckpt-<step>[-<k>]/dense.npz          dense weights, their slots, optimizer scalars (rank 0)
    ckpt-<step>[-<k>]/tables/<b>/<t>/<part>-r<rank>.npy   one saved shard per file
    ckpt-<step>[-<k>]/tables/<b>/<t>/<map>-r<rank>.npy    a dynamic table's key map, per rank

``<b>`` and ``<t>`` are the positions of the block and of the table in the manifest, and
``<part>`` is ``table`` or ``slot<i>``: file names never contain a table, column, block or
slot name, so no name can lead a file outside the checkpoint. A dynamic table's ``<map>``
files are ``keymap`` (its slots: key, count, last step), ``candidates`` (the same for keys
not admitted yet) and ``counters`` (step, admitted, evicted). Every path read from the
manifest is resolved and must stay inside the checkpoint; so must ``latest``.

Example:
    >>> checkpoint_name(42)
    'ckpt-000000042'
    >>> parse_name("ckpt-000000042-1")
    (42, 1)
"""

from __future__ import annotations

import os
import re

from merlin_models_de.persistence.io import (
    TMP_PREFIX,
    TRASH_PREFIX,
    WRITING_PREFIX,
    StorageError,
    inside,
    write_atomic,
)

LATEST = "latest"
MANIFEST = "manifest.json"
DENSE = "dense.npz"
# Leftovers of interrupted saves and removals; the next successful save deletes them.
LEFTOVER_PREFIXES = (TMP_PREFIX, TRASH_PREFIX, WRITING_PREFIX)
_NAME = re.compile(r"ckpt-([0-9]{9,})(?:-([0-9]+))?")


def checkpoint_name(step: int, index: int = 0) -> str:
    """Directory name of the ``index``-th checkpoint saved for ``step`` (0: the first)."""
    return f"ckpt-{step:09d}" + (f"-{index}" if index else "")


def parse_name(name: str):
    """``(step, index)`` of a checkpoint directory name, or None for any other name."""
    match = _NAME.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(2) or 0))


def free_name(directory: str, step: int) -> str:
    """The first checkpoint name for ``step`` that nothing in ``directory`` uses yet.

    A re-saved step gets a new name, so the checkpoint ``latest`` names is never replaced in
    place (a crash mid-replacement would leave ``latest`` pointing at nothing).
    """
    index = 0
    while os.path.lexists(os.path.join(directory, checkpoint_name(step, index))):
        index += 1
    return checkpoint_name(step, index)


def part_stem(block_index: int, table_index: int, part_index: int) -> str:
    """Path (inside the checkpoint, without rank and suffix) of one part of one table."""
    part = "table" if part_index == 0 else f"slot{part_index - 1}"
    return f"tables/{block_index}/{table_index}/{part}"


MAP_FILES = ("keymap", "candidates", "counters")


def map_stem(block_index: int, table_index: int, what: str) -> str:
    """Path (inside the checkpoint, without rank and suffix) of one of a dynamic table's
    key map files (``what``: one of :data:`MAP_FILES`)."""
    return f"tables/{block_index}/{table_index}/{what}"


def shard_file(root: str, stem: str, rank: int) -> str:
    """The file of the shard that ``rank`` saved of the part ``stem``."""
    return inside(root, f"{stem}-r{rank}.npy", what="checkpoint shard file")


def read_latest(directory: str) -> str | None:
    """Path of the checkpoint ``directory/latest`` names, or None without ``latest``.

    Raises:
        StorageError: when ``latest`` holds anything but a checkpoint name inside
            ``directory`` (an absolute path, ``..``, a symlink leading out).
    """
    pointer = os.path.join(directory, LATEST)
    if not os.path.lexists(pointer):
        return None
    problem = pointer_problem(directory)
    if problem:
        raise StorageError(problem)
    try:
        with open(pointer, encoding="utf-8") as f:
            name = f.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"Cannot read the checkpoint pointer {pointer}: {exc}") from exc
    if parse_name(name) is None:
        raise StorageError(
            f"The checkpoint pointer {pointer} must hold the name of a "
            f"checkpoint directory next to it (ckpt-<step>). "
            f"Received: latest={name!r}"
        )
    try:
        return inside(directory, name, what="latest")
    except StorageError as exc:
        raise StorageError(
            f"The checkpoint pointer {pointer} leads outside {directory}. "
            f"Received: latest={name!r}"
        ) from exc


def pointer_problem(directory: str, advice: str = "") -> str | None:
    """Why ``directory/latest`` is there but no file that can be read or replaced (a
    directory, a symlink leading nowhere, a device), with ``advice``; or None."""
    pointer = os.path.join(directory, LATEST)
    if not os.path.lexists(pointer) or os.path.isfile(pointer):
        return None
    if os.path.isdir(pointer):
        kind = "a directory"
    elif os.path.islink(pointer) and not os.path.exists(pointer):
        kind = f"a symlink to {os.readlink(pointer)!r}, which does not exist"
    else:
        kind = "not a regular file"
    return (
        f"The checkpoint pointer {pointer} is {kind}, not a file naming a checkpoint: no "
        f"save can point it at a new checkpoint, and no restore can tell which to read."
        f"{' ' + advice if advice else ''} Received: latest={kind!r}"
    )


def write_latest(directory: str, name: str) -> None:
    """Points ``directory/latest`` at ``name`` atomically (write aside, flush, rename)."""
    write_atomic(os.path.join(directory, LATEST), name + "\n")


def leftovers(directory: str) -> list:
    """Names of the temporaries in ``directory`` (interrupted saves and removals). Listed by
    a writer when it takes the directory's lock: their writers no longer hold it."""
    return sorted(n for n in os.listdir(directory) if n.startswith(LEFTOVER_PREFIXES))
