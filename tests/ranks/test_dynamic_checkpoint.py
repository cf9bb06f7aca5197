"""Dynamic tables in sharded checkpoints, on 2 ranks: keys, rows, Adagrad's accumulators,
counters, candidates and default rows restore into 2 ranks and into one process (and a
one process's checkpoint into 2 ranks, each key re-homed to its owner), and training goes on
as if never stopped: the next steps' losses and the final tables equal an uninterrupted run."""

import numpy as np
import pytest

from merlin_models_de import DynamicTable, comm
from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
from tests.ranks import dynamic_checkpoint as dc
from tests.ranks import dynamic_model as dm
from tests.ranks.oracle_dlrm import LossRecorder
from tests.ranks.test_fit import reference

PER_RANK = 16
# one process's share holds 16 keys and 16 candidates, a rank's of 2 only 8 of each
OVERFULL = {
    "item": DynamicTable(capacity=16, evict="lfu"),
    "history": DynamicTable(capacity=16, evict="lru", admit_after=3),
}


def rank_rows(lo, hi):
    """This rank's rows of the global batches in ``[lo, hi)``."""
    n, r = comm.size(), comm.rank()
    batch = PER_RANK * n
    return np.concatenate(
        [np.arange(s + r * PER_RANK, s + (r + 1) * PER_RANK) for s in range(lo, hi, batch)]
    )


def shared_dir(factory, name):
    return comm.broadcast_object(str(factory.mktemp(name)) if comm.rank() == 0 else None)


def assert_same(got, want, exact=True, what=""):
    assert sorted(got) == sorted(want), what
    for key, value in want.items():
        if exact or key.startswith(("keys/", "counters/", "step/", "candidates/", "iterations")):
            np.testing.assert_array_equal(got[key], value, err_msg=f"{what} {key}")
        else:
            np.testing.assert_allclose(
                got[key], value, rtol=2e-5, atol=2e-6, err_msg=f"{what} {key}"
            )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """2 ranks train the first half, save, and train the second half: the data, the
    checkpoint, the state it holds, the second half's per-step losses and the final state."""
    n = comm.size()
    data = comm.broadcast_object(dm.make_data(n * PER_RANK * dc.STEPS, dc.STEPS, seed=3))
    half = len(data["label"]) // 2
    model = dc.compiled(data, dc.LR)
    model.fit(dm.dataset(data, rank_rows(0, half), PER_RANK), epochs=1, verbose=0)
    directory = shared_dir(tmp_path_factory, "saved")
    save_checkpoint(model, directory)
    saved = dc.dynamic_state(model)
    assert len(saved["candidates/history"]) > 5  # keys seen once wait for a second sighting
    losses = LossRecorder()
    second = dm.dataset(data, rank_rows(half, 2 * half), PER_RANK)
    model.fit(second, epochs=1, verbose=0, callbacks=[losses])
    return data, directory, saved, np.array(losses.losses), dc.dynamic_state(model)


def go_on(model, data):
    half = len(data["label"]) // 2
    losses = LossRecorder()
    second = dm.dataset(data, rank_rows(half, 2 * half), PER_RANK)
    model.fit(second, epochs=1, verbose=0, callbacks=[losses])
    return np.array(losses.losses), dc.dynamic_state(model)


def test_a_checkpoint_resumes_on_2_ranks_as_if_never_stopped(run):
    data, directory, saved, losses, final = run
    model = dc.compiled(data, dc.LR)
    restored = restore_checkpoint(model, directory)
    assert [m[("embeddings", "item")]["evicted"] for m in restored["rehomed"]] == [0] * comm.size()
    assert_same(dc.dynamic_state(model), saved, what="restored")
    got_losses, got_final = go_on(model, data)
    np.testing.assert_array_equal(got_losses, losses)
    assert_same(got_final, final, what="resumed")


@pytest.mark.full  # one process restores, saves, trains (a subprocess: ~40 s)
def test_2_ranks_to_one_process_and_one_process_to_2_ranks(run, tmp_path_factory):
    data, directory, saved, losses, final = run
    again = shared_dir(tmp_path_factory, "again")
    spec = {"world_size": comm.size(), "saved": directory, "again": again}
    ref = reference(
        spec, data, str(tmp_path_factory.mktemp("one")), runner="tests.ranks.dynamic_checkpoint"
    )
    one = {k: v for k, v in ref.items() if k.startswith("restored/")}
    restored = {k.split("/", 1)[1]: v for k, v in one.items()}
    # one process holds what the 2 ranks saved: every key with its row and state, counters
    # summed, every candidate
    assert_same(restored, saved, what="2 -> 1")
    # and trains on as the 2 ranks did: each rank's loss is its batch's mean
    per_step = np.mean(comm.allgather_object(losses), axis=0)
    np.testing.assert_allclose(ref["losses"], per_step, rtol=1e-5)
    ends = {k.split("/", 1)[1]: v for k, v in ref.items() if k.startswith("final/")}
    ends.pop("iterations")
    assert_same(ends, {k: v for k, v in final.items() if k != "iterations"}, exact=False)

    # the one process's checkpoint on 2 ranks: each key re-homed to its owner
    model = dc.compiled(data, dc.LR)
    restore_checkpoint(model, again)
    assert_same(dc.dynamic_state(model), saved, what="1 -> 2")
    got_losses, got_final = go_on(model, data)
    np.testing.assert_allclose(got_losses, losses, rtol=1e-5)
    assert_same(got_final, final, exact=False, what="1 -> 2 resumed")


def keys_owned(start, counts):
    """``counts[r]`` keys from ``start`` on that rank ``r`` of 2 owns, rank 0's first."""
    import tensorflow as tf

    from merlin_models_de.dynamic.keys import owner_of

    pool = np.arange(start, start + 200, dtype=np.int64)
    owners = owner_of(tf.constant(pool), 2).numpy()
    return [pool[owners == r][:k] for r, k in enumerate(counts)]


def one_process_checkpoint(directory, item, early, late, padding):
    """Rank 0, as one process: a block whose ``item`` table holds 16 keys, key i counted
    i + 2 times, and whose ``history`` table remembers ``early`` candidates (seen at step 1)
    and ``late`` ones (step 2); saved to ``directory``. Returns its map of ``item``."""
    import tensorflow as tf

    from merlin_models_de import DistributedEmbeddings

    with comm.single_process():
        block = DistributedEmbeddings(
            dm.schema().select_by_name(["user", "item", "history"]),
            dim=4,
            dynamic_tables=OVERFULL,
        )
        first = np.repeat(item, np.arange(1, len(item) + 1))  # key i: i + 1 times
        steps = [(first, early), (item, late)]  # then every key once more
        for keys, waiting in steps:
            history = np.resize(padding, 3 * len(keys))  # padding keys: admitted
            history[: len(waiting)] = waiting  # each candidate once
            block(
                {
                    "user": tf.zeros([len(keys), 1], tf.int64),
                    "item": tf.constant(keys[:, None]),
                    "history": tf.constant(history.reshape(-1, 3)),
                },
                training=True,
            )
        save_checkpoint(block, directory)
        return block.dynamic_table("item"), block.dynamic_counters()


def test_a_share_over_capacity_after_re_homing_evicts_by_its_policy_and_says_so(
    hvd, tmp_path_factory, capfd
):
    """One process's full table (16 keys, capacity 16) on 2 ranks of 8 rows: rank 0 owns 11
    keys and keeps the 8 its lfu policy keeps (the most counted); of 12 candidates it owns
    10, and keeps the 8 seen last."""
    from merlin_models_de import DistributedEmbeddings

    item = np.concatenate(keys_owned(dm.FIRST_KEY, [11, 5]))
    early0, late0 = np.split(keys_owned(dm.FIRST_KEY + 10**6, [10, 0])[0], [2])
    early1, late1 = np.split(keys_owned(dm.FIRST_KEY + 2 * 10**6, [0, 2])[1], [1])
    padding = keys_owned(dm.FIRST_KEY + 3 * 10**6, [2, 2])
    padding = np.concatenate(padding)
    directory = shared_dir(tmp_path_factory, "overfull")
    saved = None
    if comm.rank() == 0:
        saved = one_process_checkpoint(
            directory,
            item,
            np.concatenate([early0, early1]),
            np.concatenate([late0, late1]),
            padding,
        )
    (keys, rows), counters = comm.broadcast_object(saved)
    assert counters["item"] == {"keys": 16, "admitted": 16, "evicted": 0}

    block = DistributedEmbeddings(
        dm.schema().select_by_name(["user", "item", "history"]), dim=4, dynamic_tables=OVERFULL
    )
    block.dynamic_counters()  # built
    capfd.readouterr()
    # a shard at a time, as an elastic reset restores a fresh model
    restored = restore_checkpoint(block, directory, all_or_nothing=False)
    stats = [mine[("embeddings", "item")] for mine in restored["rehomed"]]
    assert stats == [
        {"keys": 11, "evicted": 3, "candidates": 0, "forgotten": 0},
        {"keys": 5, "evicted": 0, "candidates": 0, "forgotten": 0},
    ]
    waiting = [mine[("embeddings", "history")] for mine in restored["rehomed"]]
    assert [(w["candidates"], w["forgotten"]) for w in waiting] == [(10, 2), (2, 0)]
    # rank 0 keeps its 8 most counted keys (item[3:11]); rank 1 all 5; rows by key
    kept = np.sort(np.concatenate([item[3:11], item[11:]]))
    got_keys, got_rows = block.dynamic_table("item")
    np.testing.assert_array_equal(got_keys, kept)
    np.testing.assert_array_equal(got_rows, rows[np.searchsorted(keys, kept)])
    assert block.dynamic_counters()["item"] == {"keys": 13, "admitted": 16, "evicted": 3}
    # the candidates seen last are kept: every late one, rank 1's early one
    keymap = block.backend.keymaps["history"]
    cands = keymap.candidates.keys.numpy()[keymap.candidates.counts.numpy() > 0]
    want = np.concatenate([late0] if comm.rank() == 0 else [early1, late1])
    assert sorted(cands.tolist()) == sorted(want.tolist())
    err = capfd.readouterr().err
    if comm.rank() == 0:
        assert (
            "dynamic table 'item' (block 'embeddings') restored from 1 rank(s) into 2: 3 of 16 "
            "keys evicted by its policy, their new owner's share being full (per rank: [3, 0])"
        ) in err
        assert "dynamic table 'history' (block 'embeddings')" in err
        assert "2 of 12 candidates forgotten (per rank: [2, 0])" in err
    else:
        assert "restored from" not in err
