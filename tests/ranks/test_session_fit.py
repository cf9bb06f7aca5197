"""A session model (a GRU over un-pooled item sequences, ``sequence_combiner=None``) trained
with Merlin's fit on N ranks equals one process on the global batches: per-step losses,
tables, GRU and MLP weights, evaluate and predict (the oracle of docs/design.md)."""

import json

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.planner import ShardingType
from tests.ranks import oracle_dlrm as fc
from tests.ranks import session_model as sc
from tests.ranks.test_fit import reference

PER_RANK = 16
STEPS = 4


def embedding_block(model):
    from merlin_models_de.variables import embedding_blocks

    (block,) = embedding_blocks(model)
    return block


TABLE, ROW, COLUMN = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE


@pytest.mark.parametrize(
    "optimizer, strategy, row, column, kinds",
    [
        pytest.param(
            "sgd", "basic", None, None, dict(item_seq=TABLE, user=TABLE), marks=pytest.mark.full
        ),
        # the item table (2400 elements) row-sliced over the ranks; the planner then cuts the
        # one table left (fewer tables than ranks) into column slices
        ("adagrad", "memory_balanced", 1000, None, dict(item_seq=ROW, user=COLUMN)),
        # the item table in column slices, the user table (320 elements) whole
        pytest.param(
            "adagrad",
            "basic",
            None,
            1000,
            dict(item_seq=COLUMN, user=TABLE),
            marks=pytest.mark.full,
        ),
    ],
)
def test_session_model_fit_matches_one_process(
    hvd, tmp_path_factory, optimizer, strategy, row, column, kinds
):
    n, r = comm.size(), comm.rank()
    spec = dict(
        model="session",
        optimizer=optimizer,
        lr=0.05,
        strategy=strategy,
        row=row,
        column=column,
        world_size=n,
        per_rank=PER_RANK,
    )
    data = comm.broadcast_object(sc.make_data(n * PER_RANK * STEPS, seed=5))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("ref")))

    model = sc.build_model(spec)
    rows = fc.rank_rows(len(data["label"]), PER_RANK, n, r)
    mine = sc.take_rows(data, rows)
    model(next(iter(sc.dataset(mine, 2)))[0])
    plan = embedding_block(model).plan
    assert {t: plan.kind_of(t) for t in kinds} == kinds
    fc.restore(model, ref, "initial")
    # the forward pass (ragged [B, None, 8] sequences through the GRU) before any step
    before = model.predict(sc.dataset(mine, PER_RANK), verbose=0)
    np.testing.assert_allclose(before, ref["predictions_before"][rows], rtol=1e-5, atol=1e-6)

    model.compile(optimizer=fc.optimizer(optimizer, spec["lr"]))  # Merlin scales lr by n
    losses = fc.LossRecorder()
    model.fit(sc.dataset(mine, PER_RANK), epochs=1, verbose=0, callbacks=[losses])

    final = fc.snapshot(model)  # tables, then GRU / MLP / output weights
    assert len(final) == len([k for k in ref if k.startswith("final/")])
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    for key in ("table/item_seq", "table/user"):  # both tables trained
        assert not np.allclose(final[key], ref[f"initial/{key}"]), key
    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    assert len(per_step) == STEPS
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-4, atol=1e-5)

    evaluation = model.evaluate(sc.dataset(mine, PER_RANK), verbose=0, return_dict=True)
    want = json.loads(str(ref["evaluation"]))
    for name in ("loss", "binary_accuracy", "auc"):
        assert evaluation[name] == pytest.approx(want[name], rel=1e-4, abs=1e-5), name
    predictions = model.predict(sc.dataset(mine, PER_RANK), verbose=0)
    np.testing.assert_allclose(predictions, ref["predictions"][rows], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "optimizer, row, column, eager, kind",
    [
        # the item table whole on one rank (no column slices)
        pytest.param("sgd", None, 10**6, False, TABLE, marks=pytest.mark.full),
        ("adagrad", 1000, None, False, ROW),  # the item table row-sliced
        pytest.param("adagrad", 1000, None, True, ROW, marks=pytest.mark.full),
    ],
)
def test_next_item_model_with_a_tied_output_matches_one_process(
    hvd, tmp_path_factory, optimizer, row, column, eager, kind
):
    """Merlin's ``mm.CategoricalOutput(to_call=block["item_seq"])`` over the sharded item table,
    trained with ``SequencePredictNext`` (ragged hidden states and targets): the per-step
    losses, tables and MLP weights and evaluate's loss equal one process (where the output
    is Merlin's full softmax) on the global batches."""
    n, r = comm.size(), comm.rank()
    spec = dict(
        model="next_item",
        optimizer=optimizer,
        lr=0.05,
        strategy="basic",
        row=row,
        column=column,
        eager=eager,
        world_size=n,
        per_rank=PER_RANK,
    )
    data = comm.broadcast_object(sc.make_data(n * PER_RANK * STEPS, seed=9))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("ref")))

    model = sc.build_next_item_model(spec)
    mine = sc.take_rows(data, fc.rank_rows(len(data["label"]), PER_RANK, n, r))
    # build by a training call (scoring has no logits to give on a sharded table): every
    # position's target its own item
    first = next(iter(sc.sequences(mine, 2)))
    seq = tf.RaggedTensor.from_row_splits(first["item_seq__values"], first["item_seq__offsets"])
    model(first, training=True, targets={"item_seq": seq})
    block = embedding_block(model)
    assert block.plan.kind_of("item_seq") is kind and block["item_seq"].sharded
    fc.restore(model, ref, "initial")
    model.compile(optimizer=fc.optimizer(optimizer, spec["lr"]), run_eagerly=eager)
    losses = fc.LossRecorder()
    model.fit(
        sc.sequences(mine, PER_RANK),
        epochs=1,
        verbose=0,
        callbacks=[losses],
        pre=sc.next_item_pre(),
    )

    final = fc.snapshot(model)
    assert len(final) == len([k for k in ref if k.startswith("final/")])
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    assert not np.allclose(final["table/item_seq"], ref["initial/table/item_seq"])
    # the ranks hold different numbers of targets; each rank's training loss is weighted by
    # its share of them, so the mean over ranks is the mean over all targets
    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    assert len(per_step) == STEPS
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-4, atol=1e-5)
    evaluation = model.evaluate(
        sc.sequences(mine, PER_RANK), verbose=0, return_dict=True, pre=sc.next_item_pre()
    )
    assert evaluation["loss"] == pytest.approx(float(ref["evaluation_loss"]), rel=1e-4)
