"""Which of the keys a rank owns after a restore keep a slot, and which slot (plain NumPy).

A checkpoint restored into another world size gives each key a new owner
(:func:`.keys.owner_of` at the new size). A rank may then own more keys than its share has
rows (or more candidates than its store holds): it keeps the ones its policy would keep and
evicts the others, by the rules of :mod:`.keymap`: ``lfu`` gives up the lowest
``(count, last step)`` first, ``lru`` the lowest last step. ``ttl`` and a table that never
evicts (``None``) give up the lowest last step too: a key that has waited longest is the one
``ttl`` would take first, and a table that never evicts must still fit its rows. Candidates
(keys not admitted yet) are forgotten least recently seen first, as the map forgets them.
Ties go to the entry that comes first (the caller lists entries by saved rank, then row).

A kept entry stays in its *home* slot where it has one (the slot that held it before: a
restore into the same world size, or into one process, changes no slot), and the others
take the free slots, lowest first, in the order they come.

No TensorFlow here (a checkpoint's manifest reads :func:`candidate_rows`).

Example:
    >>> slots, evicted = rehome(
    ...     counts=[5, 1, 3], seen=[9, 9, 2], homes=[1, 0, -1], rows=2, policy="lfu"
    ... )
    >>> slots.tolist(), evicted  # (1, 9) is the lowest (count, last step): evicted
    ([1, -1, 0], 1)
"""

from __future__ import annotations

import numpy as np


def candidate_rows(option, rows: int) -> int:
    """Slots of a rank's candidates store for a share of ``rows`` rows; 0 without one
    (``admit_after=1`` admits at once). The same rule as :class:`.keymap.KeyMap`."""
    return (option.candidates or rows) if option.admit_after > 1 else 0


def eviction_order(counts, seen, policy: str | None) -> np.ndarray:
    """Indices of the entries, the first to give up first (ties: the earlier entry)."""
    from merlin_models_de.dynamic.keymap import SCORE_PART  # here: the rest needs no TensorFlow

    order = np.arange(len(counts))
    if policy == "lfu":  # np.lexsort sorts by the last key first
        return np.lexsort((order, np.minimum(seen, SCORE_PART), np.minimum(counts, SCORE_PART)))
    return np.lexsort((order, seen))


def rehome(counts, seen, homes, rows: int, policy: str | None) -> tuple[np.ndarray, int]:
    """``(slot of each entry (-1: evicted), how many were evicted)`` for entries that need
    a slot among ``rows``.

    Args:
        counts, seen: Each entry's count and last step.
        homes: Each entry's home slot in ``[0, rows)``, or -1 (no home); homes are distinct.
        rows: Slots there are.
        policy: The table's eviction policy (see the module doc).
    """
    counts, seen, homes = (np.asarray(a, np.int64) for a in (counts, seen, homes))
    n = len(counts)
    kept = np.ones(n, bool)
    evicted = max(0, n - rows)
    if evicted:
        kept[eviction_order(counts, seen, policy)[:evicted]] = False
    slots = np.full(n, -1, np.int64)
    at_home = kept & (homes >= 0)
    slots[at_home] = homes[at_home]
    taken = np.zeros(rows, bool)
    taken[homes[at_home]] = True
    movers = np.flatnonzero(kept & ~at_home)  # in entry order
    slots[movers] = np.flatnonzero(~taken)[: len(movers)]
    return slots, evicted
