"""A Merlin model with mm.DistributedEmbeddings given a bad batch: one line naming the feature
and what was received, before Keras traces a step; the same model then trains on good data."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags

import merlin_models_de  # noqa: F401 (mm.DistributedEmbeddings)
from tests.schemas import cat

SCHEMA = Schema(
    [
        cat("user", 9),
        cat("item", 9),
        ColumnSchema("click", dtype=np.float32, tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]),
    ]
)
GOOD = {"user": np.arange(8) % 9, "item": np.arange(8) % 9}
Y = np.ones(8, np.float32)


def model():
    block = mm.DistributedEmbeddings(SCHEMA, dim=4)
    built = mm.Model(
        mm.InputBlockV2(SCHEMA, categorical=block),
        mm.MLPBlock([4]),
        mm.BinaryClassificationTask("click"),
    )
    built.compile(optimizer="sgd")
    return built


def trains(built):
    loss = built.fit(GOOD, Y, batch_size=4, epochs=1, verbose=0).history["loss"][0]
    return np.isfinite(loss)


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            {**GOOD, "user": GOOD["user"].astype(np.float64)},
            r"^fit: x: feature 'user' \(block 'embeddings'\) must hold integer ids. "
            r"Received: dtype=float64$",
        ),
        pytest.param(
            {**GOOD, "user": np.stack([GOOD["user"]] * 2, axis=1)},
            r"^fit: x: feature 'user' \(block 'embeddings'\) is one-hot in the schema: one id "
            r"per sample \(\[batch\] or \[batch, 1\]\). Received: shape=\(batch, 2\)$",
            marks=pytest.mark.full,
        ),
        pytest.param(
            {"item": GOOD["item"]},
            r"^fit: x: feature 'user' \(block 'embeddings'\) is missing. Received keys: \['item'\]$",
            marks=pytest.mark.full,
        ),
    ],
)
def test_a_bad_batch_is_named_in_one_line_and_the_model_then_trains(bad, message):
    built = model()
    with pytest.raises(ValueError, match=message):
        built.fit(bad, Y, batch_size=4, epochs=1, verbose=0)
    assert trains(built)


def test_a_tf_data_element_spec_is_checked_before_the_first_step():
    built = model()
    data = tf.data.Dataset.from_tensor_slices(({**GOOD, "user": GOOD["user"] * 1.5}, Y)).batch(4)
    with pytest.raises(ValueError, match=r"^evaluate: x: .*'user'.*Received: dtype=float64$"):
        built.evaluate(data, verbose=0)
