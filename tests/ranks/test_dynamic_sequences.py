"""An un-pooled sequence feature over a dynamic table on 2 ranks: a GRU session model
(``sequence_combiner=None``: one row per key reaches the GRU) whose item ids are raw 64-bit
keys trains, while no rank's share is full, exactly as one process with the global batch:
per-step losses, dense and GRU weights, the fixed table, the default row, the dynamic table
read back by key, and the predictions after training."""

import numpy as np
import pytest

from merlin_models_de import comm
from merlin_models_de.variables import embedding_blocks
from tests.ranks import dynamic_model as dm
from tests.ranks import dynamic_sequence_model as dsm
from tests.ranks import session_model as sc
from tests.ranks.oracle_dlrm import LossRecorder, optimizer, rank_rows
from tests.ranks.test_fit import reference

PER_RANK = 16
STEPS = 5


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, request):
    n = comm.size()
    data = comm.broadcast_object(dsm.make_data(n * PER_RANK * STEPS, STEPS, seed=11))
    # the reference trains only the optimizers this run selects
    selected = sorted(
        {
            item.callspec.params["name"]
            for item in request.session.items
            if item.originalname == "test_two_ranks_train_dynamic_sequences_as_one_process"
        }
    )
    spec = {"per_rank": PER_RANK, "world_size": n, "optimizers": selected}
    ref = reference(
        spec,
        data,
        str(tmp_path_factory.mktemp("dynseq")),
        runner="tests.ranks.dynamic_sequence_model",
    )
    return data, ref


# full tier: ~25 s on 2 cores (a one-process reference run, ~15 s, and the 2-rank fit), over
# the CI tier's budget; the pooled dynamic exchange runs in the CI tier
# (test_dynamic_exchange.py)
@pytest.mark.full
@pytest.mark.parametrize("name", ["adagrad", "sgd", "adam"])
def test_two_ranks_train_dynamic_sequences_as_one_process(oracle, name):
    data, ref = oracle
    n, r = comm.size(), comm.rank()
    rows = rank_rows(len(data["label"]), PER_RANK, n, r)
    mine = sc.take_rows(data, rows)
    model = dsm.build_model()
    model(next(iter(sc.dataset(mine, 2)))[0])
    initial = {k.split("/", 2)[2]: v for k, v in ref.items() if k.startswith(f"{name}/initial/")}
    dm.start_like(model, initial)
    model.compile(optimizer=optimizer(name, dsm.LR[name]))  # Merlin scales lr by n
    losses = LossRecorder()
    model.fit(sc.dataset(mine, PER_RANK), epochs=1, verbose=0, callbacks=[losses])

    (block,) = embedding_blocks(model)
    counted = block.dynamic_counters()["item_seq"]
    assert counted["evicted"] == 0 and counted["keys"] > 60, counted
    final = dm.state(model)
    expected = {k.split("/", 2)[2]: v for k, v in ref.items() if k.startswith(f"{name}/final/")}
    assert sorted(final) == sorted(expected)
    np.testing.assert_array_equal(final["keys/item_seq"], expected["keys/item_seq"])
    for key, value in expected.items():
        np.testing.assert_allclose(final[key], value, rtol=2e-5, atol=2e-6, err_msg=key)
    # each rank's loss is its own batch's mean: their mean is the global batch's, step by step
    per_step = np.mean(comm.allgather_object(np.array(losses.losses)), axis=0)
    np.testing.assert_allclose(per_step, ref[f"{name}/losses"], rtol=1e-5)
    predicted = model.predict(sc.dataset(mine, PER_RANK), verbose=0)
    np.testing.assert_allclose(predicted, ref[f"{name}/predictions"][rows], rtol=1e-5, atol=1e-6)
