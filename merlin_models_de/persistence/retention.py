"""Which checkpoints a directory holds, and removing the ones a new save made obsolete.

Only complete checkpoints count (a manifest of this format with a save number); anything
else in the directory is left alone, except the temporaries of writers that no longer hold
the directory's lock. A checkpoint is removed in two steps (renamed out of the ``ckpt-*``
names, then deleted), so a crash never leaves half a checkpoint under a checkpoint's name.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from dataclasses import dataclass

from merlin_models_de.persistence.layout import MANIFEST, TMP_PREFIX, TRASH_PREFIX, parse_name
from merlin_models_de.persistence.manifest import FORMAT


@dataclass(frozen=True)
class Entry:
    """A complete checkpoint in a directory."""

    name: str
    step: int
    sequence: int


def complete_checkpoints(directory: str) -> list:
    """The complete checkpoints in ``directory`` (a manifest of this format with a save
    sequence number), oldest save first. Anything else is left alone by retention."""
    out = []
    for name in os.listdir(directory):
        parsed = parse_name(name)
        path = os.path.join(directory, name)
        if parsed is None or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
                raw = json.load(f)
            sequence = raw["sequence"] if raw.get("format") == FORMAT else None
        except (OSError, ValueError, AttributeError, KeyError):
            continue
        if isinstance(sequence, int) and not isinstance(sequence, bool):
            out.append(Entry(name, parsed[0], sequence))
    return sorted(out, key=lambda e: (e.sequence, e.step, e.name))


def next_sequence(directory: str) -> int:
    """Save number for a new checkpoint: one more than any complete one in ``directory``."""
    return 1 + max((e.sequence for e in complete_checkpoints(directory)), default=0)


def remove_checkpoint_dir(path: str) -> None:
    """Removes a directory in two steps: an atomic rename out of the ``ckpt-*`` names, then
    the deletion; a crash in between leaves a ``.trash-*`` leftover, never half a checkpoint."""
    trash = os.path.join(os.path.dirname(path), f"{TRASH_PREFIX}{uuid.uuid4().hex}")
    os.rename(path, trash)
    shutil.rmtree(trash)


def prune(directory: str, current: str, keep: int | None, stale=()) -> None:
    """Removes what the checkpoint ``current`` (which ``latest`` names) makes obsolete.

    Other checkpoints of the same step (superseded by ``current``), with ``keep`` the complete
    checkpoints beyond the ``keep`` newest saves, and the temporaries named in ``stale``
    (:func:`~merlin_models_de.persistence.layout.leftovers` of writers gone before this one
    took the lock) -- never a temporary that appeared since: it may be another writer's save
    in progress. Best effort: a failure warns, and the next save tries again.
    """
    entries = complete_checkpoints(directory)
    step = parse_name(current)[0]
    doomed = [e for e in entries if e.step == step and e.name != current]
    if keep is not None:
        newest_first = [e for e in reversed(entries) if e not in doomed]
        doomed += [e for e in newest_first[keep:] if e.name != current]
    for entry in doomed:
        _try(remove_checkpoint_dir, os.path.join(directory, entry.name))
    for name in stale:
        path = os.path.join(directory, name)
        if not os.path.lexists(path):
            continue
        if (
            name.startswith((TMP_PREFIX, TRASH_PREFIX))
            and not os.path.islink(path)
            and os.path.isdir(path)
        ):
            _try(shutil.rmtree, path)
        else:
            _try(os.remove, path)


def _try(action, path) -> None:
    try:
        action(path)
    except OSError as exc:
        warnings.warn(
            f"Could not remove {path} ({exc}); the next checkpoint save retries.",
            RuntimeWarning,
            stacklevel=3,
        )
