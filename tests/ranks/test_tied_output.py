"""The tied CategoricalOutput over a sharded item table in Merlin's ``fit`` / ``evaluate``:
N ranks with per-rank batch B against one process (a subprocess without Horovod, Merlin's own
full-logits softmax) with batch N*B and N times the learning rate: per-step losses and final
tables and dense weights equal."""

import json

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.planner.types import ShardingType
from merlin_models_de.variables import embedding_blocks
from tests.ranks import tied_reference as tr
from tests.ranks.test_fit import reference as fit_reference

PER_RANK, STEPS = 8, 4


def reference(spec, data, tmp):
    return fit_reference(spec, data, tmp, runner="tests.ranks.tied_reference")


# basic deals the tables in turn: "user" to rank 0, "item" whole to rank 1 (rank 0 holds no
# item rows); a row-slice threshold below the item table's 400 elements splits it by rows
LAYOUTS = {"table_wise": dict(strategy="basic"), "row_sliced": dict(strategy="basic", row=300)}


# every value of every parameter in 4 runs (each ~40-80 s of CI time); the eager vocab-parallel
# step is also checked on 2 ranks by test_vocab_parallel.py, and the output against Merlin's
# in graph and eager mode, with and without bias, by tests/unit/test_outputs_tied.py
@pytest.mark.parametrize(
    "layout, optimizer, eager, plain, bias",
    [
        pytest.param("table_wise", "sgd", False, False, False, marks=pytest.mark.full),
        pytest.param("row_sliced", "adagrad", False, True, False, marks=pytest.mark.full),
        pytest.param("table_wise", "sgd", True, True, False, marks=pytest.mark.full),
        # CI: the item table row-sliced under Merlin's CategoricalOutput(to_call=...) trains in
        # test_session_fit.py; the output bias against Merlin's in tests/unit/test_outputs_tied.py
        pytest.param("row_sliced", "adagrad", False, False, True, marks=pytest.mark.full),
    ],
)
def test_fit_with_a_sharded_tied_output_equals_one_process(
    hvd, tmp_path_factory, layout, optimizer, eager, plain, bias
):
    """``plain``: Merlin's own ``mm.CategoricalOutput(to_call=block["item"])``; ``bias``: a
    bias per item, sharded like the table (its own block, ``item_output_bias``)."""
    n, r = comm.size(), comm.rank()
    spec = dict(
        LAYOUTS[layout],
        optimizer=optimizer,
        eager=eager,
        lr=0.3,
        world_size=n,
        per_rank=PER_RANK,
        chunk_rows=16,
        plain=plain,
        bias=bias,
    )
    data = comm.broadcast_object(tr.make_data(n * PER_RANK * STEPS, seed=7))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("tied")))

    model, block = tr.build_model(dict(spec, block="de"))
    want_kind = ShardingType.ROW_WISE if layout == "row_sliced" else ShardingType.TABLE_WISE
    assert block.plan.kind_of("item") is want_kind and block["item"].sharded
    rows = tr.rank_rows(n * PER_RANK * STEPS, PER_RANK, n, r)
    x, y = tr.split_xy(data, rows)
    model({k: tf.constant(v[:2]) for k, v in x.items()}, targets=tf.constant(y[:2]), training=True)
    tr.restore(model, block, ref, "initial")
    losses = tr.train(model, x, y, PER_RANK, spec, spec["lr"])  # Merlin scales lr by n

    per_step = np.mean(comm.allgather_object(losses), axis=0)
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-5, atol=1e-6)
    final = tr.snapshot(model, block)
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-6, err_msg=key)
    assert not np.allclose(final["table/item"], ref["initial/table/item"])  # it trained
    if bias:
        bias_block = next(b for b in embedding_blocks(model) if b is not block)
        assert [(s.rank, s.row_start, s.rows) for s in bias_block.plan.shards] == [
            (s.rank, s.row_start, s.rows) for s in block.plan.shards_of("item")
        ]
        assert not np.allclose(
            final["table/item_output_bias"], ref["initial/table/item_output_bias"]
        )

    # evaluate from exactly the reference's trained weights: the trained ones agree to
    # ~1e-5, which can swap two items of nearly equal score in a ranking
    tr.restore(model, block, ref, "final")
    evaluation = model.evaluate(tr.dataset(x, y, PER_RANK), verbose=0, return_dict=True)
    # metric states are summed over ranks: the means over the global data
    want = json.loads(str(ref["evaluation"]))
    assert evaluation["loss"] == pytest.approx(want["loss"], rel=1e-5)
    # the top-k metrics (vocab-parallel top-k) equal the exact ranks of one process's full
    # logits; Merlin's own add up to 1e-6 of noise to scores (tie breaking), so they may
    # differ by one example's swap with an item scoring within 1e-6
    for name in ("recall_at_10", "mrr_at_10", "ndcg_at_10", "map_at_10", "precision_at_10"):
        assert evaluation[name] == pytest.approx(want[f"exact/{name}"], rel=1e-5), name
        assert evaluation[name] == pytest.approx(want[name], abs=1.0 / (2 * len(y))), name
    assert want["exact/recall_at_10"] > 0
    # predict: each rank its own examples' logits over the whole catalog
    predictions = model.predict(tr.dataset(x, y, PER_RANK), verbose=0)
    assert predictions.shape == (len(y), tr.ITEMS)
    np.testing.assert_allclose(predictions, ref["predictions"][rows], rtol=1e-5, atol=1e-5)
    # top-k prediction (ShardedTopK: per-rank top-k merged across ranks) and its metrics
    top_k = tr.top_k_outputs(model, x, y, PER_RANK)
    np.testing.assert_array_equal(top_k["top_k/ids"], ref["top_k/ids"][rows])
    np.testing.assert_allclose(
        top_k["top_k/scores"], ref["top_k/scores"][rows], rtol=1e-5, atol=1e-6
    )
    for name in ("recall_at_10", "mrr_at_10", "ndcg_at_10"):
        assert top_k[f"top_k/{name}"] == pytest.approx(float(ref[f"top_k/{name}"]), rel=1e-5), name


def test_a_target_outside_the_catalog_on_one_rank_fails_every_rank(hvd):
    n, r = comm.size(), comm.rank()
    spec = dict(LAYOUTS["row_sliced"], optimizer="sgd", lr=0.1)
    model, _ = tr.build_model(dict(spec, block="de"))
    x, y = tr.split_xy(tr.make_data(PER_RANK, seed=2 + r))
    if r == n - 1:
        y[3] = tr.ITEMS + 5
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"(?s)mmde_tied_item.*catalog.*example:\D+{tr.ITEMS}\D+"
        rf"{tr.ITEMS + 5}\D+{n - 1}\D+3\b",
    ):
        tr.train(model, x, y, PER_RANK, spec, spec["lr"])
    got = comm.allgather(tf.constant([comm.rank()]), name="tied_after_bad_target").numpy()
    np.testing.assert_array_equal(got, np.arange(comm.size()))


def test_a_column_sliced_item_table_is_refused_on_every_rank(hvd):
    import merlin.models.tf as mm

    from merlin_models_de.outputs.tied import TiedCategoricalOutput

    block = mm.DistributedEmbeddings(
        tr.schema(), dim=tr.DIM, strategy="basic", column_slice_threshold=200
    )
    assert block.plan.kind_of("item") is ShardingType.COLUMN_WISE
    with pytest.raises(ValueError, match="Table 'item' is column-sliced across ranks"):
        TiedCategoricalOutput(to_call=block["item"], target=tr.TARGET)


@pytest.mark.parametrize(
    "layout, optimizer, eager",
    [
        pytest.param("row_sliced", "sgd", False, marks=pytest.mark.full),
        pytest.param("table_wise", "adagrad", True, marks=pytest.mark.full),
    ],
)
def test_contrastive_with_global_in_batch_negatives_equals_one_process(
    hvd, tmp_path_factory, layout, optimizer, eager
):
    """``mm.ContrastiveOutput(to_call=block["item"])`` with GlobalInBatchSampler: each query
    scores every rank's positives (looked up through the sharded table), so the losses and
    trained weights equal one process on the global batch; Merlin's local "in-batch" does
    not (fewer negatives per query)."""
    n, r = comm.size(), comm.rank()
    per_rank = 12  # Merlin's default top-10 metrics need >= 10 candidates, locally too
    spec = dict(
        LAYOUTS[layout],
        optimizer=optimizer,
        eager=eager,
        lr=0.3,
        world_size=n,
        per_rank=per_rank,
        output="contrastive",
    )
    data = comm.broadcast_object(tr.make_data(n * per_rank * STEPS, seed=11))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("contrastive")))
    rows = tr.rank_rows(n * per_rank * STEPS, per_rank, n, r)
    x, y = tr.split_xy(data, rows)

    def trained(sampler_is_global):
        model, block = tr.build_model(dict(spec, block="de", **{"global": sampler_is_global}))
        assert block["item"].sharded
        model(
            {k: tf.constant(v[:2]) for k, v in x.items()}, targets=tf.constant(y[:2]), training=True
        )
        tr.restore(model, block, ref, "initial")
        losses = tr.train(model, x, y, per_rank, spec, spec["lr"])
        return model, block, np.mean(comm.allgather_object(losses), axis=0)

    model, block, per_step = trained(True)
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-5, atol=1e-6)
    final = tr.snapshot(model, block)
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-6, err_msg=key)
    assert not np.allclose(final["table/item"], ref["initial/table/item"])
    _, _, local = trained(False)
    assert not np.allclose(local, ref["losses"], rtol=1e-3)


@pytest.mark.parametrize(
    "bias",
    [pytest.param(False, marks=pytest.mark.full), pytest.param(True, marks=pytest.mark.full)],
)
def test_a_saved_model_with_the_sharded_tied_output_reloads_and_scores_the_same(
    hvd, tmp_path_factory, bias
):
    """model.save on every rank (rank 0 writes the single-process SavedModel), then
    load_model on every rank: the loaded output is tied to the loaded block's (sharded)
    table and predicts what the trained model predicts. With an output bias, also a sharded
    checkpoint restored into a model placed differently (the table and its bias whole on
    one rank) predicts the same."""
    from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
    from tests.ranks.test_checkpoint import shared_dir

    n, r = comm.size(), comm.rank()
    spec = dict(LAYOUTS["row_sliced"], optimizer="adagrad", lr=0.3)
    model, block = tr.build_model(dict(spec, block="de", plain=not bias, bias=bias))
    data = comm.broadcast_object(tr.make_data(n * PER_RANK * 2, seed=13))
    x, y = tr.split_xy(data, tr.rank_rows(n * PER_RANK * 2, PER_RANK, n, r))
    tr.train(model, x, y, PER_RANK, spec, spec["lr"])
    want = model.predict(tr.dataset(x, y, PER_RANK), verbose=0)
    path = shared_dir(tmp_path_factory, "saved") + "/model"
    model.save(path)
    if bias:
        checkpoints = shared_dir(tmp_path_factory, "checkpoints")
        save_checkpoint(model, checkpoints)
        other, _ = tr.build_model(dict(LAYOUTS["table_wise"], block="de", bias=True))
        other({k: tf.constant(v[:2]) for k, v in x.items()})
        restore_checkpoint(other, checkpoints)
        np.testing.assert_allclose(
            other.predict(tr.dataset(x, y, PER_RANK), verbose=0), want, rtol=1e-5, atol=1e-6
        )
    loaded = tf.keras.models.load_model(path)
    loaded_block, *bias_blocks = embedding_blocks(loaded)
    assert len(bias_blocks) == int(bias)
    assert loaded_block is not block and loaded_block["item"].sharded
    (output,) = loaded.model_outputs
    assert output.to_call.table.block is loaded_block
    got = loaded.predict(tr.dataset(x, y, PER_RANK), verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_to_top_k_encoders_layer_on_several_ranks(hvd):
    """``to_top_k_encoder()`` of a model tied to a sharded table scores it with ShardedTopK;
    with a candidate dataset (encoded by Merlin through dask, not in step across ranks) it is
    refused on every rank at once, naming the way out."""
    from merlin_models_de.merlin.hooks import top_k_encoder_layer
    from merlin_models_de.outputs.topk import ShardedTopK

    model, block = tr.build_model(dict(LAYOUTS["row_sliced"], block="de", bias=True))
    layer = top_k_encoder_layer(model, None, 7)
    assert isinstance(layer, ShardedTopK) and layer.table is block["item"]
    assert layer._k == 7 and layer.bias_table == "item_output_bias"
    with pytest.raises(
        ValueError,
        match=r"to_top_k_encoder\(candidates\) encodes the candidate "
        r"dataset.*\(2 ranks\).*Received: candidates=str",
    ):
        top_k_encoder_layer(model, "a dataset", 7)
    got = comm.allgather(tf.constant([comm.rank()]), name="after_top_k_refusal").numpy()
    np.testing.assert_array_equal(got, np.arange(comm.size()))


@pytest.mark.full  # 24 s; the CI tier's steps_per_execution: tests/commands/test_dlrm.py
def test_steps_per_execution_trains_as_one_step_per_call(hvd):
    """Keras' ``steps_per_execution`` runs several steps (each with its exchanges) in one
    call: the same losses and tables as one step per call, on every rank."""
    n, r = comm.size(), comm.rank()
    data = comm.broadcast_object(tr.make_data(n * PER_RANK * 6, seed=17))
    x, y = tr.split_xy(data, tr.rank_rows(n * PER_RANK * 6, PER_RANK, n, r))
    runs = []
    for steps in (1, 4):  # 6 steps: one execution of 4, then one of 2
        model, block = tr.build_model(dict(LAYOUTS["row_sliced"], block="de"))
        model.compile(optimizer=tr.optimizer("adagrad", 0.3), steps_per_execution=steps)
        history = model.fit(tr.dataset(x, y, PER_RANK), epochs=2, verbose=0)
        runs.append((history.history["loss"], tr.snapshot(model, block)))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-6)
    for key, value in runs[0][1].items():
        np.testing.assert_allclose(runs[1][1][key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    assert not np.allclose(
        runs[0][1]["table/item"],
        tr.build_model(dict(LAYOUTS["row_sliced"], block="de"))[1].get_global_weights()["item"],
    )
