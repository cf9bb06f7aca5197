"""Merlin's model-level API on 2 ranks against one process (the oracle): tables frozen and
resumed by name (freeze_blocks / unfreeze_all_frozen_blocks), and mm.MultiOptimizer with
mm.LazyAdam for sharded tables (sparse updates, local slots)."""

import numpy as np
import pytest

from merlin_models_de import comm
from merlin_models_de.variables import embedding_blocks, local_slot_refs
from tests.ranks import model_api_training as common
from tests.ranks.test_fit import PER_RANK, started_like_reference


def run_both(spec, tmp_path_factory, seed):
    ref, model, _, x_mine, y_mine = started_like_reference(
        spec, tmp_path_factory, seed, runner="tests.ranks.model_api_training"
    )
    got = common.train(model, x_mine, y_mine, PER_RANK, spec, spec["lr"])
    for key, value in got.items():
        np.testing.assert_allclose(value, ref[key], rtol=1e-4, atol=1e-5, err_msg=key)
    return model, ref, got


@pytest.mark.full  # 31 s; the CI tier's frozen tables on 2 ranks: test_regularization.py
def test_tables_frozen_by_name_train_as_in_one_process(hvd, tmp_path_factory):
    spec = dict(
        optimizer="adagrad",
        lr=0.05,
        strategy="memory_balanced",
        column=4000,
        world_size=comm.size(),
        per_rank=PER_RANK,
        freeze=["C1", "C3"],
    )
    model, ref, got = run_both(spec, tmp_path_factory, seed=7)
    for t in ("C1", "C3"):  # untouched while frozen: no rank moved its slice
        np.testing.assert_array_equal(got[f"frozen/table/{t}"], ref[f"initial/table/{t}"])
        assert not np.array_equal(got[f"final/table/{t}"], got[f"frozen/table/{t}"])
    assert not np.array_equal(got["frozen/table/C2"], ref["initial/table/C2"])
    assert embedding_blocks(model)[0].plan.kind_of("C1").value == "column_wise"


@pytest.mark.full  # LazyAdam/MultiOptimizer in one process: tests/unit/test_model_api.py
def test_multi_optimizer_with_lazy_adam_trains_as_in_one_process(hvd, tmp_path_factory):
    spec = dict(
        optimizer="multi",
        lr=0.05,
        strategy="memory_balanced",
        column=4000,
        world_size=comm.size(),
        per_rank=PER_RANK,
        lazy=["C1", "C2"],
    )
    model, ref, got = run_both(spec, tmp_path_factory, seed=8)
    block = embedding_blocks(model)[0]
    lazy = model.optimizer.optimizers_and_blocks[0].optimizer
    local = local_slot_refs(model.optimizer, model.variables)
    for t in spec["lazy"]:
        for var in block[t].weights:  # this rank's shards; their slots are local too
            for name in ("m", "v"):
                slot = lazy.get_slot(var, name)
                assert slot.ref() in local and slot.shape == var.shape, (t, name)
    # (the oracle above holds only if these gradients stayed sparse: LazyAdam's dense path
    # is Adam's, which moves every row with a moment, looked up in this step or not)
    assert not np.allclose(got["final/table/C1"], ref["initial/table/C1"])
