"""The bench's speed bound, ``--embeddings local-tables``: what one step of it trains and sends.

It must do the least an exact sharded step does (the dense average) and nothing more, or the
bound it gives is not one. The reference is the same wrapper averaging every gradient.
"""

import numpy as np
import tensorflow as tf

from merlin_models_de import comm
from tests.ranks import oracle_dlrm as fc
from tests.tf_inspection import collectives

PER_RANK = 32


def _one_step(args, schema, x, y, initial, average_tables: bool):
    """The DLRM command's model after one step (Keras' train function, no callbacks: Merlin's
    fit would broadcast rank 0's weights after it) from the weights ``initial``;
    ``average_tables``: the reference, the same wrapper averaging every gradient."""
    from merlin_models_de.apps.common.optimizers import optimizer_for
    from merlin_models_de.apps.dlrm.model import model_for
    from merlin_models_de.compat.horovod import distributed_optimizer

    model, emb = model_for(args, schema)
    model({k: tf.constant(v[:2]) for k, v in x.items()})
    model.set_weights(initial)
    if average_tables:
        optimizer = distributed_optimizer(
            tf.keras.optimizers.legacy.SGD(args.learning_rate),
            is_local=lambda var: False,
            prefix="mmde_reference",
        )
    else:
        optimizer = optimizer_for(args, emb)
    model.compile(optimizer=optimizer)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_RANK)
    model.make_train_function()(iter(batches))
    return model, {v.ref() for v in emb.trainable_variables}


def test_local_tables_train_each_rank_alone_and_average_only_the_dense_gradients(hvd):
    """After one SGD step: the dense weights equal those of a step that averages everything,
    every rank's table copy moved by its own rows only (the copies' moves add up to the
    averaged step's, the local gradients being divided by the world size), and the step's
    only collective is the dense average."""
    from merlin_models_de.apps.dlrm import options as dlrm_options
    from merlin_models_de.apps.dlrm.model import model_for

    args = dlrm_options.parser().parse_args(
        [
            "--embeddings",
            "local-tables",
            "--optimizer",
            "sgd",
            "--dim",
            "4",
            "--bottom-mlp",
            "8",
            "--top-mlp",
            "8",
            "--learning-rate",
            "0.5",
        ]
    )
    schema = fc.small_schema()
    data = fc.only_columns(fc.make_data(PER_RANK * comm.size(), seed=11), schema.column_names)
    mine = fc.rank_rows(PER_RANK * comm.size(), PER_RANK, comm.size(), comm.rank())
    x, y = fc.split_xy({k: v[mine] for k, v in data.items()}, None)
    tf.keras.utils.set_random_seed(1)  # the same initial weights on every rank
    start, _ = model_for(args, schema)
    start({k: tf.constant(v[:2]) for k, v in x.items()})
    initial, before = start.get_weights(), [v.numpy() for v in start.trainable_variables]

    bound, tables = _one_step(args, schema, x, y, initial, average_tables=False)
    names = collectives(bound.train_function)
    assert names and all("mmde_bound" in n for n in names), names
    reference, _ = _one_step(args, schema, x, y, initial, average_tables=True)
    assert len(tables) == 4  # the small schema's 4 categorical columns
    apart = 0
    for i, (b, r, w0) in enumerate(
        zip(bound.trainable_variables, reference.trainable_variables, before)
    ):
        if b.ref() in tables:
            moves = comm.allgather_object(w0 - b.numpy(), name=f"mmde_test_moves_{i}")
            np.testing.assert_allclose(
                np.sum(moves, axis=0), w0 - r.numpy(), rtol=1e-5, atol=1e-7, err_msg=b.name
            )
            apart += not np.allclose(moves[0], moves[1])
        else:
            np.testing.assert_allclose(b.numpy(), r.numpy(), rtol=1e-5, atol=1e-7, err_msg=b.name)
    assert apart == len(tables), "the ranks' rows differ, so every table's copies must too"
