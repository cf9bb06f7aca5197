"""A 16-bit table's update beyond its dtype on one rank stops every rank with one message:
each rank sees its own shards only, and a rank that stopped alone would leave the others
waiting in the next step's collectives."""

import re

import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, RowWiseAdagrad, comm
from merlin_models_de.merlin.training import DistributedGradientTape
from tests.ranks.test_errors import still_in_step
from tests.schemas import cat

ROWS = 50


def _block():
    """Tables "a" (rank 0) and "b" (rank 1), stored in float16; "b" starts at 60000."""
    schema = Schema([cat("a", ROWS - 1), cat("b", ROWS - 1)])
    block = DistributedEmbeddings(
        schema, dim=4, backend="horovod", strategy="basic", table_dtype="float16"
    )
    ids = tf.constant(np.arange(8) + 8 * comm.rank(), tf.int64)
    block({"a": ids, "b": ids})
    assert [s.rank for s in block.plan.shards_of("b")] == [1]
    block.set_global_weights(
        {"a": np.zeros([ROWS, 4], np.float32), "b": np.full([ROWS, 4], 60000, np.float32)}
    )
    return block, {"a": ids, "b": ids}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_an_update_beyond_float16_on_rank_1_stops_both_ranks_alike(hvd, graph):
    """Every row moves up by ~the learning rate (10000): "a" (rank 0) from 0, within range;
    "b" (rank 1) from 60000, beyond 65504. Both ranks fail with the same message naming
    "b" and rank 1, neither writes, and a collective afterwards still pairs up."""
    block, inputs = _block()
    optimizer = RowWiseAdagrad(10_000.0)
    variables = block.trainable_variables

    def step():
        with tf.GradientTape() as tape:
            out = block(inputs, training=True)
            loss = -tf.add_n([tf.reduce_sum(v) for v in out.values()])
        grads = DistributedGradientTape(tape, variables).gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))

    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        tf.function(step)() if graph else step()
    # the assertion's message (graph mode adds the node and where it was defined around it)
    found = re.search(r"Table \\?'b\\?' is stored.*?\(one per rank\)\.", str(raised.value), re.S)
    assert found, raised.value
    message = found.group(0).replace("\\'", "'")
    assert message.startswith(
        "Table 'b' is stored in float16 (table_dtype), whose largest value is 65504; the "
        "update would write values beyond it or inf/NaN on rank(s) [1], so the step stops "
        "on every rank, writing nothing."
    ), message
    # rank 1's rows moved from 60000 by ~8450
    assert "Largest |value| of its new rows: [0, 68" in message
    assert "Table 'a'" not in str(raised.value)
    assert comm.allgather_object(message) == [message] * comm.size()
    still_in_step()
    tables = block.get_global_weights()
    assert (tables["b"] == 60000).all() and (tables["a"] == 0).all()  # nothing written
