"""One rank's key -> row map of a dynamic table: admission, eviction, counters.

The map is fed the keys this rank owns, in the order every rank sees them (rank 0's batch
first), once per training step (:meth:`KeyMap.update`). Its decisions depend on that stream
alone, so they are the same in one process fed the same keys: with no eviction, N ranks
with batch B give every key the row one process with batch N*B gives it (rows are drawn
from the key, ``keys.py``); with eviction, each rank's map equals a one-process map fed
that rank's keys (``tests/dynamic_reference.py`` is that reference in plain Python).

Within a step the keys are taken in the order they first appear. A key seen before keeps
its row (its count and last step are updated); a new key is admitted once its sightings
(remembered by :attr:`KeyMap.candidates` until then) reach ``admit_after``. Admitted keys
take the free rows first (lowest row first), then the rows the policy gives up: the lowest
``(count, last step)`` for ``lfu``, the lowest last step for ``lru``, rows unused for more
than ``ttl`` steps for ``ttl``; ties go to the lowest row, and a row used in this step is
never taken. A key that finds no row reads the default row and tries again when seen next.

The index is TensorFlow's ``MutableHashTable`` (CPU kernels; on a GPU TensorFlow places it on
the host). The slots' keys, counts and last steps are plain variables, which the sharded
checkpoint saves; the index is rebuilt from them.

Example:
    >>> keymap = KeyMap(rows=1000, option=DynamicTable(capacity=2000), name="item")  # doctest: +SKIP
    >>> taken, keys = keymap.update(tf.constant([7, 7, 9], tf.int64))  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de.tables import DynamicTable

AutoTrackable = tf.__internal__.tracking.AutoTrackable

NEVER = 2**63 - 1  # a score no row is taken at
FREE = -1  # an empty row's score: empty rows go first
SCORE_PART = 2**31 - 1  # each half of an lfu score (count, last step) is capped at this


def _int64(value: int):
    return tf.constant(value, tf.int64)


class SlotTable(AutoTrackable):
    """``rows`` slots, each empty or holding one key, its count and the step it was last seen.

    Trackable but not a ``tf.Module``: the block tracks it, so a SavedModel holds the index its
    lookups read, while Keras does not count its variables as weights (which Horovod would
    broadcast from rank 0 and checkpoints would save as the block's)."""

    def __init__(self, rows: int, name: str, prefix: bool = False):
        super().__init__()
        self.rows = rows

        def variable(suffix):
            return tf.Variable(tf.zeros([rows], tf.int64), trainable=False, name=f"{name}_{suffix}")

        self.keys = variable("keys")
        self.counts = variable("counts")  # 0: the slot is empty
        self.seen = variable("seen")  # the step a key was last seen (steps count from 1)
        # prefix=True (a table that never empties a slot): slots [0, filled) are used, the rest
        # empty, so new keys take the next rows without scoring every row; ``rows`` once the
        # order is unknown (a map loaded whole), which always scores
        self.filled = (
            tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_filled")
            if prefix
            else None
        )
        self.index = tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.int64, default_value=-1, name=f"{name}_index"
        )

    def find(self, keys):
        """The slot of each key, -1 where it has none."""
        slots = self.index.lookup(keys)
        slots.set_shape(keys.shape)  # the table's lookup has no static shape in a graph
        return slots

    def touch(self, slots, counts, step) -> None:
        """Adds ``counts`` to ``slots`` and marks them seen at ``step``."""
        at = slots[:, None]
        self.counts.scatter_nd_add(at, counts)
        self.seen.scatter_nd_update(at, tf.fill(tf.shape(slots), step))

    def set(self, slots, counts, step) -> None:
        """Sets the counts of ``slots`` and marks them seen at ``step``."""
        at = slots[:, None]
        self.counts.scatter_nd_update(at, counts)
        self.seen.scatter_nd_update(at, tf.fill(tf.shape(slots), step))

    def scores(self, policy: str | None, step, ttl: int | None, keep):
        """int64 ``[rows]``: the order rows are taken in (lowest first; NEVER: not taken).
        ``keep``: slots used in this step, never taken."""
        used = self.counts > 0
        if policy == "lfu":
            score = tf.minimum(self.counts, SCORE_PART) * (SCORE_PART + 1) + tf.minimum(
                self.seen, SCORE_PART
            )
        elif policy == "lru":
            score = self.seen
        elif policy == "ttl":
            score = tf.where(step - self.seen > ttl, self.seen, _int64(NEVER))
        else:
            score = tf.fill([self.rows], _int64(NEVER))
        score = tf.where(used, score, _int64(FREE))
        return tf.tensor_scatter_nd_update(
            score, keep[:, None], tf.fill(tf.shape(keep), _int64(NEVER))
        )

    def place(self, keys, counts, step, scores):
        """Puts the first keys into the rows of lowest ``scores()`` (as many as have a score
        below NEVER). Returns ``(rows taken, the keys placed, how many keys were evicted)``."""

        def ranked():
            k = tf.minimum(tf.size(keys), self.rows)
            top = tf.math.top_k(-scores(), k)  # equal scores: the lower row first
            m = tf.reduce_sum(tf.cast(top.values > -NEVER, tf.int32))
            return tf.cast(top.indices[:m], tf.int64)

        def next_rows():  # the empty rows are the suffix: the lowest of them, no scoring
            return self.filled + tf.range(tf.size(keys, out_type=tf.int64))

        def placed():
            if self.filled is None:
                taken = ranked()
            else:
                room = self.rows - self.filled
                taken = tf.cond(tf.size(keys, out_type=tf.int64) <= room, next_rows, ranked)
            m = tf.size(taken)
            new_keys = keys[:m]
            was_used = tf.gather(self.counts, taken) > 0
            evicted = tf.boolean_mask(tf.gather(self.keys, taken), was_used)
            self.index.remove(evicted)
            self.index.insert(new_keys, taken)
            self.keys.scatter_nd_update(taken[:, None], new_keys)
            self.set(taken, counts[:m], step)
            if self.filled is not None:
                self.filled.assign(tf.minimum(self.filled + tf.cast(m, tf.int64), self.rows))
            return taken, new_keys, tf.size(evicted, out_type=tf.int64)

        def nothing():
            empty = tf.zeros([0], tf.int64)
            return empty, empty, tf.constant(0, tf.int64)

        return tf.cond(tf.size(keys) > 0, placed, nothing)

    def forget(self, keys) -> None:
        """Empties the slots of ``keys`` (those it holds)."""
        slots = self.find(keys)
        held = slots >= 0
        self.counts.scatter_nd_update(
            tf.boolean_mask(slots, held)[:, None],
            tf.zeros([tf.reduce_sum(tf.cast(held, tf.int32))], tf.int64),
        )
        self.index.remove(tf.boolean_mask(keys, held))

    def rebuild_index(self) -> None:
        """The index from the slots (after the variables were restored). New keys take the
        next empty rows while the used rows are a prefix; with holes, they go by scores."""
        used = self.counts > 0
        if self.filled is not None:
            n = tf.reduce_sum(tf.cast(used, tf.int64))
            prefix = tf.reduce_all(tf.equal(used, tf.range(self.rows, dtype=tf.int64) < n))
            self.filled.assign(tf.where(prefix, n, tf.constant(self.rows, tf.int64)))
        self.index.remove(self.index.export()[0])
        self.index.insert(tf.boolean_mask(self.keys, used), tf.cast(tf.where(used)[:, 0], tf.int64))

    def variables(self) -> list:
        return [self.keys, self.counts, self.seen] + (
            [self.filled] if self.filled is not None else []
        )


class KeyMap(AutoTrackable):
    """The key -> row map of one rank's slice (``rows`` rows) of a dynamic table."""

    def __init__(self, rows: int, option: DynamicTable, name: str):
        super().__init__()
        self.option = option
        self.table = SlotTable(rows, name, prefix=True)  # a key map never empties a row
        # keys seen fewer than admit_after times, with their sightings (lru when full)
        self.candidates = (
            SlotTable(option.candidates or rows, f"{name}_candidates")
            if option.admit_after > 1
            else None
        )
        self.step = tf.Variable(1, dtype=tf.int64, trainable=False, name=f"{name}_step")
        self.admitted = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_admitted")
        self.evicted = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_evicted")

    def lookup(self, keys):
        """The row of each key, -1 where it has none (it reads the default row)."""
        return self.table.find(keys)

    def update(self, keys):
        """One training step's keys (this rank's, in stream order): counts them, admits and
        evicts. Returns ``(rows given to new keys, those keys)``: their rows and optimizer
        state must start afresh."""
        step = self.step.read_value()
        unique, where = tf.unique(keys, out_idx=tf.int64)
        counts = tf.math.unsorted_segment_sum(
            tf.ones_like(where), where, tf.size(unique, out_type=tf.int64)
        )
        slots = self.table.find(unique)
        hit = slots >= 0
        used = tf.boolean_mask(slots, hit)
        self.table.touch(used, tf.boolean_mask(counts, hit), step)
        new, new_counts = tf.boolean_mask(unique, ~hit), tf.boolean_mask(counts, ~hit)
        total, want = self._sightings(new, new_counts)

        def scores():  # scored only when the empty rows do not suffice
            return self.table.scores(self.option.evict, step, self.option.ttl, keep=used)

        taken, placed, evicted = self.table.place(
            tf.boolean_mask(new, want), tf.boolean_mask(total, want), step, scores
        )
        if self.candidates is not None:
            # the first len(taken) wanted keys got rows; the others wait, in stream order
            wanted_before = tf.cumsum(tf.cast(want, tf.int32), exclusive=True)
            got = tf.logical_and(want, wanted_before < tf.size(taken))
            self.candidates.forget(placed)
            self._remember(tf.boolean_mask(new, ~got), tf.boolean_mask(total, ~got), step)
        self.admitted.assign_add(tf.size(taken, out_type=tf.int64))
        self.evicted.assign_add(evicted)
        self.step.assign_add(1)
        return taken, placed

    def _sightings(self, keys, counts):
        """``(sightings so far, admitted?)`` of keys without a row."""
        if self.candidates is None:
            return counts, tf.ones_like(keys, tf.bool)
        slots = self.candidates.find(keys)
        before = tf.where(
            slots >= 0,
            tf.gather(self.candidates.counts, tf.maximum(slots, 0)),
            tf.zeros_like(slots),
        )
        total = before + counts
        return total, total >= self.option.admit_after

    def _remember(self, keys, totals, step) -> None:
        """Keeps the sightings of keys still without a row (new ones by lru)."""
        cands = self.candidates
        slots = cands.find(keys)
        known = slots >= 0
        old = tf.boolean_mask(slots, known)
        cands.set(old, tf.boolean_mask(totals, known), step)

        def scores():
            return cands.scores("lru", step, None, keep=old)

        cands.place(tf.boolean_mask(keys, ~known), tf.boolean_mask(totals, ~known), step, scores)

    def variables(self) -> list:
        """Every variable of the map (all differ by rank)."""
        tables = [self.table] + ([self.candidates] if self.candidates is not None else [])
        return [v for t in tables for v in t.variables()] + [
            self.step,
            self.admitted,
            self.evicted,
        ]
