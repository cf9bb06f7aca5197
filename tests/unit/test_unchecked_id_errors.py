"""With ``validate_ids=False`` an id outside its table fails in TF's gather, which names the
lookup (docs/block.md): also inside ``fit``, where an optimizer that gathers its slots at the
gradient's ids (Adagrad) could fail first and name its own node."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings
from tests.schemas import cat


def test_fit_names_the_lookup_not_the_optimizer():
    schema = Schema([cat("item", 99_999)])
    model = mm.Model(
        mm.InputBlockV2(
            schema, categorical=DistributedEmbeddings(schema, dim=4, validate_ids=False)
        ),
        mm.MLPBlock([4]),
        mm.BinaryOutput("click"),
    )
    model.compile(optimizer="adagrad")
    # two good batches, then one with an id outside the table
    ids = np.concatenate([np.arange(8), np.arange(8), [0, 1, 100_050, 3, 4, 5, 6, 7]])
    data = tf.data.Dataset.from_tensor_slices(({"item": ids}, np.ones(24, np.float32))).batch(8)
    for _ in range(3):  # each call runs the traced step again: the order must not vary
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            model.fit(data, epochs=1, verbose=0)
        detected = [l for l in str(raised.value).splitlines() if "Detected at node" in l]
        assert "lookup_item_in_table_item" in detected[0], detected
