"""The optimizers the commands offer, their per-rank learning rates, and the Keras optimizer an
``--optimizer`` option names (TensorFlow loads only when one is made: the options are checked
before)."""

from __future__ import annotations

from merlin_models_de import comm
from merlin_models_de.apps.common.options import LOCAL_TABLES

OPTIMIZERS = ("sgd", "adagrad", "adam", "rowwise_adagrad")
# per-rank learning rate by optimizer (Merlin multiplies it by the world size)
LEARNING_RATES = {"sgd": 0.05, "adagrad": 0.05, "adam": 0.001, "rowwise_adagrad": 0.05}


def optimizer_for(args, emb=None):
    """The legacy Keras optimizer of ``--optimizer``. With ``--embeddings local-tables`` on
    several ranks, wrapped so that only the dense gradients are averaged (one grouped
    allreduce a step) and each rank trains its own copy of every table of ``emb``.

    That is not a valid training (the copies drift apart); it is the speed bound of an exact
    sharded step on the same host: half the samples' compute per rank, every table's lookups
    and updates for them, and the one dense average that any exact design needs, with no rows
    exchanged."""
    import tensorflow as tf

    from merlin_models_de.kernels.rowwise.adagrad import RowWiseAdagrad

    legacy = tf.keras.optimizers.legacy
    lr = args.learning_rate or LEARNING_RATES[args.optimizer]
    optimizer = {
        "sgd": legacy.SGD,
        "adagrad": legacy.Adagrad,
        "adam": legacy.Adam,
        "rowwise_adagrad": RowWiseAdagrad,  # the block's tables only (check_options)
    }[args.optimizer](lr)
    if getattr(args, "embeddings", None) != LOCAL_TABLES or comm.size() == 1:
        return optimizer
    from merlin_models_de.compat.horovod import distributed_optimizer

    tables = {v.ref() for v in emb.trainable_variables}
    return distributed_optimizer(
        optimizer, is_local=lambda var: var.ref() in tables, prefix="mmde_bound"
    )


def add_learning_rate(group) -> None:
    """The commands' ``--learning-rate`` (read by :func:`optimizer_for`)."""
    group.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="per-rank rate (Merlin multiplies it by the world size)",
    )
