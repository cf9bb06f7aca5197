"""Bad input on one rank fails every rank with a clear error, and nobody hangs."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from tests.ranks import oracle


def make_block():
    return DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        backend="horovod",
        sequence_combiner=oracle.COMBINERS,
        strategy="memory_balanced",
        column_slice_threshold=4000,
    )


def inputs_for(block, size, seed=0):
    return oracle.select(oracle.global_batch(block.features, block.tables, size, seed), 0, size)


def still_in_step():
    """A collective after the error: proves the ranks did not drift apart or hang."""
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()


def test_different_batch_sizes_across_ranks_fail_on_every_rank(hvd):
    block = make_block()
    block(inputs_for(block, 8))
    size = 8 if comm.rank() == 0 else 6
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)Every rank must feed the same per-rank batch size.*8, 6",
    ):
        block(inputs_for(block, size))
    still_in_step()


def test_bad_id_on_one_rank_names_it_there_and_fails_the_others(hvd):
    block = make_block()
    good = inputs_for(block, 8)
    block(good)
    bad = dict(good)
    if comm.rank() == 1:
        bad["item"] = tf.constant([[1], [2], [3], [1000], [4], [5], [6], [7]], tf.int64)
        message = (
            r"(?s)An id is outside its table. Received: feature=.*item.*id=.*1000.*rows=.*1000"
        )
    else:
        message = r"(?s)Invalid input on another rank \(this is rank 0\).*0, 1"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        block(bad)
    still_in_step()
    out = block(good)  # and the block works again afterwards
    assert out["item"].shape == (8, 8)


def test_uneven_last_batch_in_graph_mode(hvd):
    block = make_block()
    step = tf.function(lambda x: block(x))
    step(inputs_for(block, 8))
    size = 8 if comm.rank() == 0 else 5
    with pytest.raises(tf.errors.InvalidArgumentError, match="same per-rank batch size"):
        step(inputs_for(block, size))
    still_in_step()


def _one_rank_bad(block, good, make_bad):
    """Rank 1 gets ``make_bad(good)``; rank 0 the good batch."""
    return make_bad(dict(good)) if comm.rank() == 1 else good


def drop_feature(batch):
    del batch["city"]
    return batch


@pytest.mark.parametrize(
    "make_bad, message",
    [
        (drop_feature, r"(?s)Feature 'city' is missing from the batch"),
        (
            lambda b: {**b, "user": tf.constant([[1, 2]] * 8, tf.int64)},
            r"(?s)Feature 'user' is one-hot in the schema but its input has 2 ids per sample",
        ),
        (
            lambda b: {**b, "device": tf.constant([["a"]] * 8)},
            r"(?s)Feature 'device' must hold integer ids. Received: dtype=string",
        ),
        (
            lambda b: {**b, "item": tf.constant([[1.7]] * 8)},
            r"(?s)Feature 'item' must hold integer ids. Received: dtype=float32",
        ),
        (
            lambda b: {k: v[:0] for k, v in b.items()},
            r"(?s)Received an empty batch \(batch size 0\)",
        ),
    ],
    ids=["missing", "two-ids-one-hot", "string", "float", "empty"],
)
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_problem_found_before_the_exchange_fails_every_rank(hvd, make_bad, message, mode):
    """The bad rank names the problem; the other names the rank; a caught error leaves both
    ranks in step (the next collective completes)."""
    block = make_block()
    good = inputs_for(block, 8)
    step = tf.function(lambda x: block(x)) if mode == "graph" else block
    step(good)
    batch = _one_rank_bad(block, good, make_bad)
    # graph-mode assertions print their strings escaped ('x' as \'x\')
    message = message.replace("'", r"\\?'")
    expected = (
        message if comm.rank() == 1 else r"(?s)Invalid input on another rank \(this is rank 0\)"
    )
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=expected):
        step(batch)
    still_in_step()
    assert step(good)["item"].shape == (8, 8)


def test_empty_batch_on_every_rank_fails_on_every_rank(hvd):
    block = make_block()
    good = inputs_for(block, 8)
    block(good)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Received an empty batch"):
        block({k: v[:0] for k, v in good.items()})
    still_in_step()


def test_a_table_too_big_for_any_rank_is_refused_on_every_rank_before_allocation(hvd):
    from merlin.schema import Schema

    from tests.schemas import cat

    schema = Schema([cat("user", 2**40 - 1), cat("item", 99)])
    block = DistributedEmbeddings(schema, dim=16, backend="horovod")
    with pytest.raises(
        MemoryError,
        match=r"Rank \d would hold 64.0 TiB of embedding tables "
        r"\(largest: table 'user'.*Received: table 'user' "
        r"rows=1099511627776 dim=16",
    ):
        block({"user": tf.constant([1, 2]), "item": tf.constant([3, 4])})
    still_in_step()


def test_ranks_with_different_numbers_of_batches_fail_fit_evaluate_predict_together(hvd):
    """A rank that ran out of batches would leave the others in the step's exchange; each
    call checks the counts first and raises on every rank, naming them."""
    from tests.ranks import tied_reference as tr

    model, _ = tr.build_model({"block": "de", "row": 300})
    model.compile(optimizer="sgd")
    rows = 24 if comm.rank() == 0 else 16
    x, y = tr.split_xy(tr.make_data(rows, seed=comm.rank()))
    data = tr.dataset(x, y, 8)  # 3 batches on rank 0, 2 on rank 1
    counts = r"Batches per rank: \{0: 3, 1: 2\}"
    with pytest.raises(
        ValueError,
        match=rf"fit: every rank must run the same number of "
        rf"batches.*{counts}.*pass steps_per_epoch=2",
    ):
        model.fit(data, verbose=0)
    for method in ("evaluate", "predict"):
        with pytest.raises(ValueError, match=rf"{method}: every rank.*{counts}.*steps=2"):
            getattr(model, method)(data, verbose=0)
    still_in_step()
    history = model.fit(data, steps_per_epoch=2, verbose=0)  # what the error suggests
    assert len(history.history["loss"]) == 1
    assert model.predict(data, steps=2, verbose=0).shape == (16, tr.ITEMS)
    still_in_step()


def test_without_id_validation_fit_reports_the_ids_outside_their_tables(hvd, capfd):
    """validate_ids=False: a row-sliced table reads zero rows for ids outside it (no error),
    and fit puts their count over every rank into each epoch's logs; rank 0 names the
    feature. Epoch 1 feeds 3 bad ids on rank 1 only, epoch 2 none."""
    from tests.ranks import oracle_dlrm as fc

    model = fc.build_model(
        {
            "strategy": "memory_balanced",
            "block_options": {"row_slice_threshold": 1, "validate_ids": False},
        }
    )
    x, y = fc.split_xy(fc.make_data(64, seed=comm.rank()), {})
    if comm.rank() == 1:  # rows of the first epoch's batches (4 batches of 8)
        x["C1"][[1, 5, 30], 0] = [fc.SCHEMA_ROWS + 5, 10**6, -3]
    model.compile(optimizer="sgd")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    history = model.fit(data, epochs=2, steps_per_epoch=4, verbose=0)
    assert history.history["out_of_range_ids"] == [3, 0]
    assert all(np.isfinite(history.history["loss"]))
    assert not [v.name for v in model.variables if "out_of_range" in v.name]  # not a weight
    err = capfd.readouterr().err
    if comm.rank() == 0:
        assert "epoch 1: 3 ids outside their tables" in err and "/C1': 3" in err, err
        assert "epoch 2:" not in err
    else:
        assert "ids outside their tables" not in err
    still_in_step()


class _Steps(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.done = 0

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1


def test_a_bad_id_exchanged_a_step_ahead_fails_its_own_step_on_every_rank(hvd):
    """fit with a tf.data input: step i sends batch i+1's ids (backends/horovod/ahead.py). A bad id in
    rank 1's third batch is found by step 2 and fails step 3, on both ranks, naming it on
    rank 1; the two steps before train, and fit works again on good data."""
    from tests.ranks import oracle_dlrm as fc

    model = fc.build_model({"strategy": "memory_balanced"})
    x, y = fc.split_xy(fc.make_data(32, seed=comm.rank()), {})
    good = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    if comm.rank() == 1:
        x = {k: v.copy() for k, v in x.items()}
        x["C1"][2 * 8 + 3, 0] = 10**6
        message = r"(?s)An id is outside its table\. Received: feature=.*C1.*id=.*1000000.*rows="
    else:
        message = r"(?s)Invalid input on another rank \(this is rank 0\).*\[0 1\]"
    model.compile(optimizer="sgd")
    steps = _Steps()
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), verbose=0, callbacks=[steps])
    assert steps.done == 2
    still_in_step()
    history = model.fit(good, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    still_in_step()
