"""Dynamic tables on 2 ranks: while no rank's share is full, training equals one process with
the global batch (per-step losses, dense weights, the fixed table, the default rows, and the
dynamic tables read back by key) for SGD, Adagrad, row-wise Adagrad and Adam; with eviction,
each rank's key map equals the plain-Python reference map fed the keys that rank owns; the
saved model serves every key from its trained row."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DynamicTable, comm
from merlin_models_de.dynamic.keys import owner_of
from merlin_models_de.variables import embedding_blocks
from tests.dynamic_reference import ReferenceKeyMap
from tests.ranks import dynamic_model as dm
from tests.ranks.one_process import one_process_env
from tests.ranks.oracle_dlrm import LossRecorder, optimizer
from tests.ranks.test_fit import reference

PER_RANK = 16
STEPS = 6


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, request):
    n = comm.size()
    data = comm.broadcast_object(dm.make_data(n * PER_RANK * STEPS, STEPS))
    # the reference trains only the optimizers this run tests (the CI tier: sgd, adagrad)
    selected = sorted(
        {
            item.callspec.params["name"]
            for item in request.session.items
            if item.originalname == "test_two_ranks_train_dynamic_tables_as_one_process"
        }
    )
    spec = {"per_rank": PER_RANK, "world_size": n, "optimizers": selected}
    ref = reference(
        spec, data, str(tmp_path_factory.mktemp("dyn")), runner="tests.ranks.dynamic_model"
    )
    return data, ref


def rank_rows(total):
    n, r = comm.size(), comm.rank()
    batch = PER_RANK * n
    return np.concatenate(
        [np.arange(s + r * PER_RANK, s + (r + 1) * PER_RANK) for s in range(0, total, batch)]
    )


@pytest.mark.parametrize(
    "name",
    [
        "sgd",
        "adagrad",
        pytest.param("rowwise_adagrad", marks=pytest.mark.full),
        pytest.param("adam", marks=pytest.mark.full),
    ],
)
def test_two_ranks_train_dynamic_tables_as_one_process(oracle, name):
    data, ref = oracle
    model = dm.build_model(dm.no_eviction())
    x, _ = dm.inputs(data, np.arange(2))
    model(x)
    initial = {k.split("/", 2)[2]: v for k, v in ref.items() if k.startswith(f"{name}/initial/")}
    dm.start_like(model, initial)
    model.compile(optimizer=optimizer(name, dm.LR[name]))
    losses = LossRecorder()
    rows = rank_rows(len(data["label"]))
    model.fit(dm.dataset(data, rows, PER_RANK), epochs=1, verbose=0, callbacks=[losses])
    final = dm.state(model)
    expected = {k.split("/", 2)[2]: v for k, v in ref.items() if k.startswith(f"{name}/final/")}
    (block,) = embedding_blocks(model)
    assert block.dynamic_counters()["item"]["evicted"] == 0
    assert sorted(final) == sorted(expected)
    for table in ("item", "history"):  # every key has its row, as in one process
        np.testing.assert_array_equal(final[f"keys/{table}"], expected[f"keys/{table}"])
        assert len(final[f"keys/{table}"]) > 40
    for key, value in expected.items():
        np.testing.assert_allclose(final[key], value, rtol=2e-5, atol=2e-6, err_msg=key)
    # each rank's loss is its own batch's mean: their mean is the global batch's, step by step
    per_step = np.mean(comm.allgather_object(np.array(losses.losses)), axis=0)
    np.testing.assert_allclose(per_step, ref[f"{name}/losses"], rtol=1e-5)


POLICIES = {
    "item": DynamicTable(capacity=16, evict="lfu"),
    "history": DynamicTable(capacity=16, evict="lru", admit_after=2, candidates=6),
}


def test_each_rank_evicts_as_the_reference_fed_its_keys():
    """Capacity 16 (8 rows a rank) for ~90 keys: both shards evict every step."""
    n, r = comm.size(), comm.rank()
    data = comm.broadcast_object(dm.make_data(n * PER_RANK * STEPS, STEPS, seed=5))
    model = dm.build_model(POLICIES)
    model.compile(optimizer="adagrad")
    rows = rank_rows(len(data["label"]))
    model.fit(dm.dataset(data, rows, PER_RANK), epochs=1, verbose=0)
    (block,) = embedding_blocks(model)
    batch = PER_RANK * n
    for table, option in POLICIES.items():
        shard = next(s for s in block.plan.shards_on(r) if s.table == table)
        expected = ReferenceKeyMap(shard.rows, option)
        for lo in range(0, len(data["label"]), batch):  # the step's keys, rank 0's first
            keys = np.reshape(data[table][lo : lo + batch], [-1])
            mine = owner_of(tf.constant(keys, tf.int64), n).numpy() == r
            expected.update(keys[mine].tolist())
        keymap = block.backend.keymaps[table]
        counts, keys = keymap.table.counts.numpy(), keymap.table.keys.numpy()
        held = {int(k): s for s, (k, c) in enumerate(zip(keys, counts)) if c > 0}
        assert held == expected.rows_of(), table
        assert (int(keymap.admitted.numpy()), int(keymap.evicted.numpy())) == (
            expected.admitted,
            expected.evicted,
        ), table
        assert expected.evicted > 0, table  # the policy was exercised


@pytest.mark.full  # 66 s: a save and a fresh process's load
def test_the_saved_model_maps_every_key_to_its_trained_row(tmp_path_factory):
    """model.save on 2 ranks writes one process's SavedModel: it predicts what the 2 ranks
    predict, keys never seen included (they read the default row)."""
    n, r = comm.size(), comm.rank()
    data = comm.broadcast_object(dm.make_data(n * PER_RANK * 3, 3, seed=7))
    data["item"][::5] += 10**9  # every fifth sample asks for a key training never saw
    model = dm.build_model(dm.no_eviction())
    model.compile(optimizer="adagrad")
    rows = rank_rows(len(data["label"]))
    train = {k: v.copy() for k, v in data.items()}
    train["item"][::5] -= 10**9
    model.fit(dm.dataset(train, rows, PER_RANK), epochs=1, verbose=0)
    path = comm.broadcast_object(str(tmp_path_factory.mktemp("export")) if r == 0 else None)
    model.save(path)
    x, _ = dm.inputs(data, rows)
    mine = model.predict(x, batch_size=PER_RANK, verbose=0)
    everyone = comm.allgather_object((rows, mine))
    problem = None
    if r == 0:
        order = np.concatenate([rw for rw, _ in everyone])
        distributed = np.concatenate([p for _, p in everyone])[np.argsort(order)]
        code = (
            "import sys, numpy as np\n"
            "from tests.ranks import dynamic_model as dm\n"
            "import merlin_models_de\n"
            "data = dict(np.load(sys.argv[2]))\n"
            "m = merlin_models_de.load_model(sys.argv[1])\n"
            "x, _ = dm.inputs(data, np.arange(len(data['label'])))\n"
            "np.save(sys.argv[3], m.predict(x, batch_size=64, verbose=0))\n"
        )
        src, out = os.path.join(path, "..", "data.npz"), os.path.join(path, "..", "pred.npy")
        np.savez(src, **data)
        run = subprocess.run(
            [sys.executable, "-c", code, path, src, out],
            capture_output=True,
            text=True,
            timeout=600,
            env=one_process_env(),
        )
        problem = run.stderr[-3000:] if run.returncode else None
        if problem is None:
            try:
                np.testing.assert_allclose(np.load(out), distributed, rtol=1e-5, atol=1e-6)
            except AssertionError as err:
                problem = str(err)
    problem = comm.broadcast_object(problem)  # every rank fails with rank 0's finding
    assert problem is None, problem
