"""A session model (GRU over un-pooled item sequences, sequence_combiner=None) trained with
Merlin's fit on 2 ranks equals one process on the global batches: losses, tables, GRU and
MLP weights, evaluate and predict."""
import json

import numpy as np
import pytest

from merlin_models_de import comm
from tests.unit.horovod import fit_common as fc
from tests.unit.horovod import session_common as sc
from tests.unit.horovod.test_fit import reference

PER_RANK = 16
STEPS = 4


@pytest.mark.parametrize("optimizer, strategy, row, column", [
    ("sgd", "basic", None, None),             # whole tables on their owners
    ("adagrad", "memory_balanced", 100, None),  # the item table row-sliced
    ("adagrad", "basic", None, 4),            # column slices
])
def test_session_model_fit_matches_one_process(hvd, tmp_path_factory, optimizer, strategy,
                                                row, column):
    n, r = comm.size(), comm.rank()
    spec = dict(model="session", optimizer=optimizer, lr=0.05, strategy=strategy, row=row,
                column=column, world_size=n, per_rank=PER_RANK)
    data = comm.broadcast_object(sc.make_data(n * PER_RANK * STEPS, seed=5))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("ref")))

    model = sc.build_model(spec)
    rows = fc.rank_rows(len(data["label"]), PER_RANK, n, r)
    mine = sc.take_rows(data, rows)
    model(next(iter(sc.dataset(mine, 2)))[0])
    fc.restore(model, ref, "initial")
    model.compile(optimizer=fc.optimizer(optimizer, spec["lr"]))  # Merlin scales lr by n
    losses = fc.LossRecorder()
    model.fit(sc.dataset(mine, PER_RANK), epochs=1, verbose=0, callbacks=[losses])

    final = fc.snapshot(model)
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    assert not np.allclose(final["table/item_seq"], ref["initial/table/item_seq"])  # trained
    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-4, atol=1e-5)

    evaluation = model.evaluate(sc.dataset(mine, PER_RANK), verbose=0, return_dict=True)
    want = json.loads(str(ref["evaluation"]))
    for name in ("loss", "binary_accuracy", "auc"):
        assert evaluation[name] == pytest.approx(want[name], rel=1e-4, abs=1e-5), name
    predictions = model.predict(sc.dataset(mine, PER_RANK), verbose=0)
    np.testing.assert_allclose(predictions, ref["predictions"][rows], rtol=1e-4, atol=1e-6)
