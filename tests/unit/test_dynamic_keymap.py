"""A rank's key map (merlin_models_de/dynamic/keymap.py) against the plain-Python reference:
the same rows for the same keys, step by step, for every policy, with and without
admission after several sightings, and bounded candidates."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.dynamic.keymap import KeyMap
from merlin_models_de.tables import DynamicTable
from tests.dynamic_reference import ReferenceKeyMap

OPTIONS = {
    "lfu": DynamicTable(capacity=8, evict="lfu"),
    "lru": DynamicTable(capacity=8, evict="lru"),
    "ttl": DynamicTable(capacity=8, evict="ttl", ttl=2),
    "never": DynamicTable(capacity=8, evict=None),
    "lfu_admit_3": DynamicTable(capacity=8, evict="lfu", admit_after=3, candidates=5),
    "lru_admit_2": DynamicTable(capacity=8, evict="lru", admit_after=2),
}


def key_stream(seed, steps=40, batch=12, vocab=30):
    """Zipf-like keys (a few hot, a long tail), negative and above 2**62 too."""
    rng = np.random.default_rng(seed)
    pool = np.concatenate([np.arange(vocab - 2), [-(2**40) - 3, 2**62 + 11]])
    weights = 1.0 / np.arange(1, vocab + 1)
    return [
        rng.choice(pool, size=batch, p=weights / weights.sum()).astype(np.int64)
        for _ in range(steps)
    ]


def map_rows(keymap) -> dict:
    counts, keys = keymap.table.counts.numpy(), keymap.table.keys.numpy()
    return {int(k): s for s, (k, c) in enumerate(zip(keys, counts)) if c > 0}


@pytest.mark.parametrize("policy", sorted(OPTIONS))
def test_the_map_takes_the_rows_the_reference_takes(policy):
    option = OPTIONS[policy]
    rows = 8
    keymap, reference = KeyMap(rows, option, f"t_{policy}"), ReferenceKeyMap(rows, option)
    update = tf.function(keymap.update)  # as in fit: traced once, run every step
    for step, keys in enumerate(key_stream(seed=len(policy))):
        taken, placed = update(tf.constant(keys))
        expected = reference.update(keys.tolist())
        assert list(zip(taken.numpy().tolist(), placed.numpy().tolist())) == expected, step
        assert map_rows(keymap) == reference.rows_of(), step
        found = keymap.lookup(tf.constant(keys)).numpy().tolist()
        rows_of = reference.rows_of()
        assert found == [rows_of.get(k, -1) for k in keys.tolist()], step
    assert (int(keymap.admitted.numpy()), int(keymap.evicted.numpy())) == (
        reference.admitted,
        reference.evicted,
    )
    if option.evict is not None:
        assert reference.evicted > 0  # the stream is long enough to exercise the policy
    else:
        assert reference.evicted == 0


def test_a_key_waits_for_admit_after_sightings_and_reads_the_default_row_until_then():
    keymap = KeyMap(4, DynamicTable(capacity=4, admit_after=3), "wait")
    for seen in range(1, 4):
        taken, _ = keymap.update(tf.constant([42], tf.int64))
        row = int(keymap.lookup(tf.constant([42], tf.int64)).numpy()[0])
        assert (row >= 0) == (seen == 3), seen
    assert taken.numpy().tolist() == [0]


def test_a_row_used_in_this_step_is_never_taken():
    keymap = KeyMap(2, DynamicTable(capacity=2, evict="lru"), "busy")
    keymap.update(tf.constant([1, 2], tf.int64))
    taken, placed = keymap.update(tf.constant([1, 2, 3], tf.int64))  # full, both in use
    assert taken.numpy().tolist() == [] and placed.numpy().tolist() == []
    assert keymap.lookup(tf.constant([3], tf.int64)).numpy().tolist() == [-1]


def test_the_index_is_rebuilt_from_the_slots():
    keymap = KeyMap(4, DynamicTable(capacity=4), "rebuild")
    keymap.update(tf.constant([5, 6, 7], tf.int64))
    keymap.table.index.remove(tf.constant([5, 6, 7], tf.int64))
    keymap.table.rebuild_index()
    assert keymap.lookup(tf.constant([7, 5, 6, 8], tf.int64)).numpy().tolist() == [2, 0, 1, -1]
    # used rows 0..2 form a prefix: the next new key takes row 3 without scoring
    assert int(keymap.table.filled.numpy()) == 3
    keymap.table.counts.assign([1, 0, 1, 0])  # a hole: new keys go by scores
    keymap.table.rebuild_index()
    assert int(keymap.table.filled.numpy()) == 4
