"""With ``validate_ids=False`` an id outside its table fails in TF's gather, which names the
lookup (docs/block.md): also inside ``fit``, where an optimizer that gathers its state at the
gradient's ids (Adagrad, RowWiseAdagrad) could run that gather first and name its own node."""

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, RowWiseAdagrad
from tests.schemas import cat

LOOKUP = "lookup_item_in_table_item"


def _gathers_before_the_lookup(function) -> list:
    """Names of the variable gathers of ``function``'s traced steps that may run before the
    lookup: neither it nor anything downstream of it (data or control) feeds them."""
    found = []
    for concrete in function._list_all_concrete_functions():
        ops = concrete.graph.get_operations()
        users: dict = {}
        for op in ops:
            for source in [t.op for t in op.inputs] + list(op.control_inputs):
                users.setdefault(source, []).append(op)
        after = {op for op in ops if LOOKUP in op.name and "Gather" in op.type}
        assert after, [op.name for op in ops if "lookup" in op.name]
        stack = list(after)
        while stack:
            for user in users.get(stack.pop(), []):
                if user not in after:
                    after.add(user)
                    stack.append(user)
        found += [op.name for op in ops if op.type == "ResourceGather" and op not in after]
    return found


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_fit_names_the_lookup_not_the_optimizer(optimizer):
    schema = Schema([cat("item", 99_999)])
    model = mm.Model(
        mm.InputBlockV2(
            schema, categorical=DistributedEmbeddings(schema, dim=4, validate_ids=False)
        ),
        mm.MLPBlock([4]),
        mm.BinaryOutput("click"),
    )
    model.compile(optimizer=RowWiseAdagrad(0.1) if optimizer == "rowwise_adagrad" else optimizer)
    # two good batches, then one with an id outside the table
    ids = np.concatenate([np.arange(8), np.arange(8), [0, 1, 100_050, 3, 4, 5, 6, 7]])
    data = tf.data.Dataset.from_tensor_slices(({"item": ids}, np.ones(24, np.float32))).batch(8)
    for _ in range(3):  # each call runs the traced step again
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            model.fit(data, epochs=1, verbose=0)
        detected = [l for l in str(raised.value).splitlines() if "Detected at node" in l]
        assert LOOKUP in detected[0], detected
    # which op fails first is the executor's choice among ops ready together: no gather of
    # the optimizer's state may be ready before the lookup ran
    assert _gathers_before_the_lookup(model.train_function) == []
