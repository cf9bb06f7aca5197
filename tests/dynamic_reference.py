"""A dynamic table's key map in plain Python: the one-process reference of one rank's map.

Written from the rules in ``merlin_models_de/dynamic/keymap.py``'s docstring, one key at a
time, with no TensorFlow, so the tests compare the map's decisions with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Slots:
    rows: int
    keys: list = field(default_factory=list)
    counts: list = field(default_factory=list)
    seen: list = field(default_factory=list)

    def __post_init__(self):
        self.keys, self.counts, self.seen = [0] * self.rows, [0] * self.rows, [0] * self.rows

    def find(self, key):
        for slot in range(self.rows):
            if self.counts[slot] > 0 and self.keys[slot] == key:
                return slot
        return -1

    def order(self, policy, step, ttl, keep):
        """Rows in the order they are taken (free first, then by the policy)."""

        def score(slot):
            if self.counts[slot] == 0:
                return (-1,)
            if policy == "lfu":
                return (self.counts[slot], self.seen[slot])
            if policy == "lru":
                return (self.seen[slot],)
            if policy == "ttl" and step - self.seen[slot] > ttl:
                return (self.seen[slot],)
            return None

        ranked = [(score(s), s) for s in range(self.rows) if s not in keep]
        return [s for sc, s in sorted((x for x in ranked if x[0] is not None))]

    def place(self, keys_counts, step, order):
        placed, evicted = [], 0
        for (key, count), slot in zip(keys_counts, order):
            evicted += self.counts[slot] > 0
            self.keys[slot], self.counts[slot], self.seen[slot] = key, count, step
            placed.append((slot, key))
        return placed, evicted


class ReferenceKeyMap:
    """One rank's map of a table with ``rows`` rows and a DynamicTable ``option``."""

    def __init__(self, rows, option):
        self.option = option
        self.table = Slots(rows)
        self.candidates = Slots(option.candidates or rows) if option.admit_after > 1 else None
        self.step, self.admitted, self.evicted = 1, 0, 0

    def rows_of(self) -> dict:
        return {self.table.keys[s]: s for s in range(self.table.rows) if self.table.counts[s] > 0}

    def update(self, keys):
        step, t = self.step, self.table
        unique, counts = [], {}
        for k in keys:
            if k not in counts:
                unique.append(k)
                counts[k] = 0
            counts[k] += 1
        used, new = [], []
        for k in unique:
            slot = t.find(k)
            if slot >= 0:
                t.counts[slot] += counts[k]
                t.seen[slot] = step
                used.append(slot)
            else:
                new.append(k)
        totals = {}
        for k in new:
            before = 0
            if self.candidates is not None:
                c = self.candidates.find(k)
                before = self.candidates.counts[c] if c >= 0 else 0
            totals[k] = before + counts[k]
        wanted = [k for k in new if totals[k] >= self.option.admit_after]
        order = t.order(self.option.evict, step, self.option.ttl, set(used))
        placed, evicted = t.place([(k, totals[k]) for k in wanted], step, order)
        got = {k for _, k in placed}
        if self.candidates is not None:
            cands = self.candidates
            for k in got:
                c = cands.find(k)
                if c >= 0:
                    cands.counts[c] = 0
            rest = [k for k in new if k not in got]
            kept = []
            for k in rest:
                c = cands.find(k)
                if c >= 0:
                    cands.counts[c], cands.seen[c] = totals[k], step
                    kept.append(c)
            fresh = [(k, totals[k]) for k in rest if cands.find(k) < 0]
            cands.place(fresh, step, cands.order("lru", step, None, set(kept)))
        self.admitted += len(placed)
        self.evicted += evicted
        self.step += 1
        return placed
