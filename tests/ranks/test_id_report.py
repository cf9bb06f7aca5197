"""With validate_ids=False the ids outside their tables are reported on 2 ranks wherever
the block runs: a Merlin model's fit (its validation too), evaluate and predict; a plain
Keras model's fit with the report as a callback; a custom loop that asks for the count."""

import numpy as np
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, OutOfRangeIdsReport, comm, out_of_range_ids
from tests.ranks.test_uneven_inputs import BATCH, arrays, schemas, small_model, still_in_step

OPTIONS = {"validate_ids": False, "row_slice_threshold": 1}  # row-sliced: zero rows, no error


def with_bad_ids(rows):
    """This rank's arrays; rank 1's item ids hold 2 outside the table."""
    x, y = arrays(rows)
    if comm.rank() == 1:
        x["item"][[1, 5]] = [10**6, -3]
    return x, y


def test_a_merlin_models_evaluate_predict_and_validation_report_them(hvd, capfd):
    model = small_model(**OPTIONS)
    x, y = with_bad_ids(16)
    good = arrays(16)
    history = model.fit(*good, batch_size=BATCH, verbose=0, validation_data=(x, y), epochs=2)
    assert history.history["out_of_range_ids"] == [0, 0]
    assert history.history["val_out_of_range_ids"] == [2, 2]
    model.evaluate(x, y, batch_size=BATCH, verbose=0)
    model.predict(x, batch_size=BATCH)
    err = capfd.readouterr().err
    for what in ("epoch 1 validation", "epoch 2 validation", "evaluate", "predict"):
        said = f"merlin_models_de: {what}: 2 ids outside their tables"
        assert (said in err) == (comm.rank() == 0), (what, err[-2000:])
    assert "/item': 2" in err or comm.rank() != 0
    still_in_step()


class Ranker(tf.keras.Model):
    """docs/training.md's custom-loop model: the block and a dense head."""

    def __init__(self):
        super().__init__()
        self.embeddings = DistributedEmbeddings(schemas()[0], dim=4, backend="horovod", **OPTIONS)
        self.head = tf.keras.layers.Dense(1)

    def call(self, features):
        rows = self.embeddings(features)
        return self.head(tf.concat([rows[name] for name in sorted(rows)], axis=1))


def test_a_plain_keras_model_and_a_custom_loop_report_them(hvd, capfd):
    model = Ranker()
    x, y = with_bad_ids(16)
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[OutOfRangeIdsReport(model)])
    assert history.history["out_of_range_ids"] == [2]
    model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[OutOfRangeIdsReport(model)])
    for start in range(0, 16, BATCH):  # a custom loop's epoch
        model({k: v[start : start + BATCH] for k, v in x.items()})
    counts = out_of_range_ids(model, "epoch 1")
    assert sum(counts.values()) == 2 and counts["embeddings/item"] == 2
    assert sum(out_of_range_ids(model).values()) == 0  # read: counted from zero again
    err = capfd.readouterr().err
    for what in ("epoch 1", "evaluate"):
        assert (f"merlin_models_de: {what}: 2 ids" in err) == (comm.rank() == 0), err[-2000:]
    assert np.isfinite(history.history["loss"][0])
    still_in_step()
