"""A one-hot feature traced with an unknown width (Merlin's last-item batches through a Keras
Sequence: ``(None, None)``) trains as with mm.Embeddings; a width other than 1 is refused
when the step runs, naming the feature and the width."""

import numpy as np
import pytest
import tensorflow as tf

from tests.unit.last_item import last_item_data, last_item_model


@pytest.mark.parametrize("embeddings", ["DistributedEmbeddings", "Embeddings"])
def test_last_item_batches_train_in_graph_mode(embeddings):
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (adds mm.DistributedEmbeddings)

    batches, scalars, target = last_item_data()
    x, _ = batches[0]
    assert all(v.shape.rank == 2 and v.shape[1] == 1 for v in x.values())  # [B, 1] ids
    make = getattr(mm, embeddings)
    model = last_item_model(lambda s: make(s, dim=8), scalars, target)
    history = model.fit(batches, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_a_width_other_than_one_is_refused_when_the_step_runs():
    from merlin.schema import Schema

    from merlin_models_de import DistributedEmbeddings
    from tests.schemas import cat

    block = DistributedEmbeddings(Schema([cat("user", 9), cat("item", 9)]), dim=4)
    unknown = tf.TensorSpec([None, None], tf.int64)
    step = tf.function(lambda x: block(x), input_signature=[{"user": unknown, "item": unknown}])
    item = tf.constant([[3], [4]], tf.int64)
    assert step({"user": tf.constant([[1], [2]], tf.int64), "item": item})["user"].shape == (2, 4)
    for user, width in (
        (tf.constant([[1, 1], [2, 2]], tf.int64), 2),
        (tf.zeros([2, 0], tf.int64), 0),
    ):
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=rf"Feature \\?'user\\?' is one-hot in the schema but its input "
            rf"has\] \[{width}\] \[ids per sample",
        ):
            step({"user": user, "item": item})
