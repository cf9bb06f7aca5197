"""On 2 ranks: Merlin's last-item batches (one-hot ids traced as ``(None, None)``) train in
graph mode; a width other than 1 on one rank fails every rank together, naming it there."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from tests.unit.last_item import last_item_data, last_item_model


def still_in_step():
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()


def test_last_item_batches_train_in_graph_mode_on_every_rank(hvd):
    import merlin.models.tf as mm

    batches, scalars, target = last_item_data(every_row_here=True)
    model = last_item_model(lambda s: mm.DistributedEmbeddings(s, dim=8), scalars, target)
    history = model.fit(batches, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    still_in_step()


def test_a_wrong_width_on_one_rank_fails_every_rank(hvd):
    from merlin.schema import Schema

    from tests.schemas import cat

    block = DistributedEmbeddings(
        Schema([cat("user", 9), cat("item", 9)]), dim=4, backend="horovod"
    )
    unknown = tf.TensorSpec([None, None], tf.int64)
    step = tf.function(lambda x: block(x), input_signature=[{"user": unknown, "item": unknown}])
    good = {"user": tf.constant([[1], [2]], tf.int64), "item": tf.constant([[3], [4]], tf.int64)}
    assert step(good)["user"].shape == (2, 4)
    bad = dict(good, user=tf.constant([[1, 1], [2, 2]], tf.int64)) if comm.rank() == 1 else good
    message = (
        r"Feature \\?'user\\?' is one-hot in the schema but its input has\] \[2\]"
        if comm.rank() == 1
        else r"Invalid input on another rank \(this is rank 0\)"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        step(bad)
    still_in_step()
    assert step(good)["item"].shape == (2, 4)
