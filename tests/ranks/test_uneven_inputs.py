"""Every input fit / evaluate / predict take, uneven across 2 ranks, raises on every rank
before the first step or ends on every rank together: NumPy arrays, tensors, dicts of
them, validation data, generators and tf.data of unknown cardinality. A retry after an error
in fit's validation trains (nothing of the failed call is left behind)."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm

BATCH = 8
ROWS = {0: 32, 1: 24}  # 4 batches on rank 0, 3 on rank 1


def still_in_step():
    """A collective after the error: proves the ranks did not drift apart or hang."""
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()


def schemas():
    """(the features' schema, with the target's)."""
    from merlin.schema import ColumnSchema, Schema, Tags

    from tests.schemas import cat

    features = Schema([cat("user", 99), cat("item", 99)])
    return features, features + Schema(
        [ColumnSchema("click", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION], dtype=np.float32)]
    )


def small_model(**block_options):
    import merlin.models.tf as mm

    features, schema = schemas()
    tf.keras.utils.set_random_seed(1)
    model = mm.Model(
        mm.InputBlockV2(
            schema,
            categorical=mm.DistributedEmbeddings(
                features, dim=4, backend="horovod", **block_options
            ),
        ),
        mm.MLPBlock([4]),
        mm.BinaryOutput("click"),
    )
    model.compile(optimizer="sgd", run_eagerly=False)
    return model


def arrays(rows, seed=0):
    rng = np.random.default_rng(seed + comm.rank())
    x = {"user": rng.integers(0, 99, rows), "item": rng.integers(0, 99, rows)}
    return x, rng.integers(0, 2, rows).astype(np.float32)


class Steps(tf.keras.callbacks.Callback):
    """Counts the steps each method ran."""

    def __init__(self):
        super().__init__()
        self.train = self.test = self.predict = 0

    def on_train_batch_end(self, batch, logs=None):
        self.train += 1

    def on_test_batch_end(self, batch, logs=None):
        self.test += 1

    def on_predict_batch_end(self, batch, logs=None):
        self.predict += 1


@pytest.fixture(scope="module")
def model():
    built = small_model()
    x, y = arrays(BATCH)
    built.fit(x, y, batch_size=BATCH, verbose=0)  # built and traced once, evenly
    return built


@pytest.mark.parametrize("kind", ["numpy", "tensors"])
def test_unequal_arrays_fail_every_method_before_the_first_step(hvd, model, kind):
    x, y = arrays(ROWS[comm.rank()])
    if kind == "tensors":
        x, y = {k: tf.constant(v) for k, v in x.items()}, tf.constant(y)
    counts = r"Batches per rank: \{0: 4, 1: 3\}"
    steps = Steps()
    with pytest.raises(
        ValueError,
        match=rf"^fit: every rank must run the same number of "
        rf"batches.*{counts}.*steps_per_epoch=3",
    ):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[steps])
    with pytest.raises(ValueError, match=rf"^evaluate: every rank.*{counts}.*steps=3"):
        model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[steps])
    with pytest.raises(ValueError, match=rf"^predict: every rank.*{counts}.*steps=3"):
        model.predict(x, batch_size=BATCH, verbose=0, callbacks=[steps])
    assert (steps.train, steps.test, steps.predict) == (0, 0, 0)
    still_in_step()
    history = model.fit(x, y, batch_size=BATCH, steps_per_epoch=3, verbose=0, callbacks=[steps])
    assert steps.train == 3 and len(history.history["loss"]) == 1
    assert model.predict(x, batch_size=BATCH, steps=3, verbose=0).shape == (3 * BATCH, 1)
    still_in_step()


def test_arrays_with_last_batches_of_other_sizes_name_them(hvd, model):
    x, y = arrays(30 if comm.rank() == 0 else 28)  # 4 batches each: the last 6 and 4 rows
    with pytest.raises(
        ValueError,
        match=r"^fit: the ranks' last batches differ in size.*"
        r"\{0: 6, 1: 4\}.*steps_per_epoch=3",
    ):
        model.fit(x, y, batch_size=BATCH, verbose=0)
    # half of 33 rows and of 32 rows: 16 to train on each rank, 17 and 16 to validate
    with pytest.raises(
        ValueError,
        match=r"^fit: every rank must run the same number of "
        r"validation_split batches.*\{0: 3, 1: 2\}.*"
        r"validation_steps=2",
    ):
        model.fit(
            *arrays(33 if comm.rank() == 0 else 32),
            batch_size=BATCH,
            verbose=0,
            validation_split=0.5,
        )
    still_in_step()


def generator(rows):
    x, y = arrays(rows)
    for start in range(0, rows, BATCH):
        yield ({k: v[start : start + BATCH] for k, v in x.items()}, y[start : start + BATCH])


def unknown_length_dataset(rows):
    x, y = arrays(rows)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return data.filter(lambda *_: True)  # filtered: its cardinality is unknown


@pytest.mark.parametrize(
    "make", [generator, unknown_length_dataset], ids=["generator", "tf.data-unknown-cardinality"]
)
def test_inputs_of_unknown_length_end_on_every_rank_together(hvd, model, make, capfd):
    """Rank 0 has 4 batches, rank 1 3: every rank runs 3 steps, rank 0 says why."""
    rows = ROWS[comm.rank()]
    assert make is generator or int(make(rows).cardinality()) == tf.data.UNKNOWN_CARDINALITY
    steps = Steps()
    history = model.fit(make(rows), verbose=0, callbacks=[steps])
    assert steps.train == 3 and np.isfinite(history.history["loss"][0])
    model.evaluate(make(rows), verbose=0, callbacks=[steps])
    assert model.predict(make(rows), verbose=0, callbacks=[steps]).shape == (3 * BATCH, 1)
    assert (steps.test, steps.predict) == (3, 3)
    err = capfd.readouterr().err
    said = "x ran out on rank(s) [1] after 3 batches while the other ranks had more"
    for method in ("fit", "evaluate", "predict"):
        assert (f"{method}: {said}" in err) == (comm.rank() == 0), err[-2000:]
    still_in_step()


def test_validation_data_is_checked_before_the_first_step(hvd, model):
    """One partition for 2 ranks, and uneven arrays: each named as validation_data, with
    validation_steps, before any training step."""
    import merlin.models.tf as mm
    import pandas as pd
    from merlin.io import Dataset

    x, y = arrays(16)
    frame = pd.DataFrame({**x, "click": y})
    one_partition = mm.Loader(Dataset(frame, schema=schemas()[1]), batch_size=BATCH, drop_last=True)
    assert one_partition.dataset.npartitions == 1
    steps = Steps()
    with pytest.raises(
        ValueError,
        match=r"^fit: validation_data: the dataset has 1 "
        r"partition\(s\) for 2 ranks.*repartition",
    ):
        model.fit(
            x, y, batch_size=BATCH, verbose=0, validation_data=one_partition, callbacks=[steps]
        )
    uneven = arrays(ROWS[comm.rank()])
    with pytest.raises(
        ValueError,
        match=r"^fit: every rank must run the same number of "
        r"validation_data batches.*\{0: 4, 1: 3\}.*"
        r"validation_steps=3",
    ):
        model.fit(x, y, batch_size=BATCH, verbose=0, validation_data=uneven, callbacks=[steps])
    assert steps.train == 0
    still_in_step()
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        verbose=0,
        validation_data=uneven,
        validation_steps=3,
        callbacks=[steps],
    )
    assert steps.train == 2 and np.isfinite(history.history["val_loss"][0])
    still_in_step()


def test_a_retry_after_an_error_in_validation_trains(hvd, model):
    """An id outside its table in rank 1's validation data fails fit's validation on every
    rank, after the epoch's steps; Keras keeps that call's validation data. The retry, with
    good validation data in the same processes, trains and validates."""
    x, y = arrays(16)
    bad_x = {k: v.copy() for k, v in x.items()}
    if comm.rank() == 1:
        bad_x["item"][3] = 10**6
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside its table|another rank"):
        model.fit(x, y, batch_size=BATCH, verbose=0, validation_data=(bad_x, y))
    still_in_step()
    history = model.fit(x, y, batch_size=BATCH, verbose=0, validation_data=(x, y), epochs=2)
    assert len(history.history["val_loss"]) == 2
    assert all(np.isfinite(history.history["val_loss"]))
    still_in_step()


def test_only_rank_0_shows_progress_unless_verbose_is_given(hvd, model, capfd):
    x, y = arrays(16)
    capfd.readouterr()
    model.evaluate(x, y, batch_size=BATCH)
    out = capfd.readouterr().out
    assert ("2/2" in out) == (comm.rank() == 0), out
    model.evaluate(x, y, batch_size=BATCH, verbose=1)  # given: every rank shows it
    assert "2/2" in capfd.readouterr().out
    still_in_step()


def test_the_package_callbacks_are_not_slow(hvd):
    """Keras times the batch hooks of the first batches against the batch time; the
    broadcast of the first weights runs when training begins (the model is built), not in
    a batch hook."""
    from tests.tf_inspection import TFLogRecords

    built = small_model()
    x, y = arrays(8 * BATCH)
    built(tf.nest.map_structure(lambda v: tf.constant(v[:2]), x))
    with TFLogRecords() as logs:
        built.fit(x, y, batch_size=BATCH, verbose=0)
    assert not [
        m for m in logs.messages if "is slow compared to the batch time" in m
    ], logs.messages
    still_in_step()


def test_no_rows_on_every_rank_names_that_for_every_method(hvd, model):
    x, y = arrays(0)
    steps = Steps()
    empty = r"x has no batches on any rank .*no data to read. Batches per rank: \{0: 0, 1: 0\}"
    with pytest.raises(ValueError, match=rf"^fit: {empty}"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[steps])
    with pytest.raises(ValueError, match=rf"^evaluate: {empty}"):
        model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[steps])
    with pytest.raises(ValueError, match=rf"^predict: {empty}"):
        model.predict(x, batch_size=BATCH, verbose=0, callbacks=[steps])
    assert (steps.train, steps.test, steps.predict) == (0, 0, 0)
    still_in_step()


def test_no_rows_on_one_rank_names_it_and_the_fix(hvd, model):
    x, y = arrays(0 if comm.rank() == 1 else 2 * BATCH)
    with pytest.raises(
        ValueError,
        match=r"^fit: x has no batches on rank\(s\) \[1\] .*Batches per rank: \{0: 2, 1: 0\}\. "
        r"Give every rank rows: repartition .*or run fewer ranks\.$",
    ) as raised:
        model.fit(x, y, batch_size=BATCH, verbose=0)
    assert "steps_per_epoch=0" not in str(raised.value)
    still_in_step()


def test_float_ids_on_one_rank_fail_every_rank_before_the_first_step(hvd, model):
    x, y = arrays(BATCH)
    if comm.rank() == 1:
        x["user"] = x["user"].astype(np.float64)
    own = r"fit: x: feature 'user' \(block 'embeddings'\) must hold integer ids. Received: dtype=float64"
    with pytest.raises(
        ValueError, match=own if comm.rank() == 1 else rf"failed on rank 1: .*{own}"
    ):
        model.fit(x, y, batch_size=BATCH, verbose=0)
    still_in_step()
    assert np.isfinite(model.fit(*arrays(BATCH), batch_size=BATCH, verbose=0).history["loss"][0])
