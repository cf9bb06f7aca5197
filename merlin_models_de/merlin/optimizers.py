"""The optimizer a model with the block trains with on N ranks (what ``compile`` gives Keras).

Merlin's convention (learning rate times N, Horovod's ``DistributedOptimizer``) with the
block's rules: local variables (shards and their slots) are registered local, never
allreduced, and their gradients stay as they are (sparse ``IndexedSlices`` stay sparse, so
``mm.LazyAdam`` updates only the rows a step looked up); the global gradients go in one
grouped allreduce named the same on every rank.

``mm.MultiOptimizer``: the gradients are averaged (and local ones scaled) where its
``minimize`` computes them, for all its optimizers at once, the default one too (Merlin's own
Horovod path wraps only the others, whose allreduce then never runs inside ``minimize``);
each optimizer's learning rate is scaled by N; the blocks stay the model's own (Horovod's
wrapper would rebuild a MultiOptimizer from its config, blocks included).

Example:
    >>> model.compile(optimizer=distributed(mm.LazyAdam(0.01)))  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.step import complete_waiting
from merlin_models_de.compat import horovod as horovod_compat
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.kernels.rounding import is_narrow
from merlin_models_de.kernels.rowwise.adagrad import RowWiseAdagrad
from merlin_models_de.planner.types import MODEL_PARALLEL, OPTIMIZER_SLOTS
from merlin_models_de.variables import embedding_blocks, is_local


def keras_optimizer(optimizer):
    """The optimizer Merlin's ``compile`` makes of ``optimizer``: a name (``"sgd"``) or a
    config as a legacy Keras optimizer; an optimizer as it is."""
    return tf.keras.optimizers.get(optimizer, use_legacy_optimizer=True)


def scaled_optimizer(optimizer, factor):
    """A legacy Keras optimizer like ``optimizer`` with its learning rate times ``factor``."""
    opt = keras_optimizer(optimizer)
    config = opt.get_config()
    lr = opt.learning_rate
    if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
        lr_config = lr.get_config()
        lr_config["initial_learning_rate"] *= factor
        config["learning_rate"] = lr.__class__.from_config(lr_config)
    else:
        config["learning_rate"] = float(tf.keras.backend.get_value(lr)) * factor
    return opt.__class__.from_config(config)


# the planner's names of the package's own optimizers (by lower-case class name)
PLANNER_NAMES = {"rowwiseadagrad": "rowwise_adagrad"}


def slot_copies(optimizer) -> tuple[str, int] | None:
    """``(name, extra copies per parameter)`` of a compiled optimizer, for
    ``block.summary()``; None where one number cannot say it (a MultiOptimizer, whose tables
    may each have another optimizer) or the optimizer is unknown."""
    optimizer = _unwrapped(optimizer)
    # Horovod's DistributedOptimizer subclasses the optimizer's class: name the first class
    # of the optimizer's own library
    name = next(
        c.__name__ for c in type(optimizer).__mro__ if not c.__module__.startswith("horovod")
    ).lower()
    name = PLANNER_NAMES.get(name, name)
    if is_multi_optimizer(optimizer) or name not in OPTIMIZER_SLOTS:
        return None
    try:
        config = optimizer.get_config()
    except (NotImplementedError, TypeError, ValueError, AttributeError):
        return None  # a summary must never break compile
    extra = int(name in ("sgd", "rmsprop") and bool(config.get("momentum")))
    extra += int(name == "rmsprop" and bool(config.get("centered")))
    extra += int(bool(config.get("amsgrad")))
    return name, OPTIMIZER_SLOTS[name] + extra


def is_multi_optimizer(optimizer) -> bool:
    """Merlin's ``MultiOptimizer`` (one optimizer per group of blocks)."""
    return hasattr(optimizer, "optimizers_and_blocks")


def distributed(optimizer, prefix: str = "mmde_grad"):
    """``optimizer`` for N ranks (see the module docstring). Made here already: kept (a
    model compiled again); a Horovod ``DistributedOptimizer`` of the user's: rebuilt from the
    optimizer inside (its learning rate as given; its ``compression`` is not applied)."""
    if getattr(optimizer, "_mmde_distributed", False):
        return optimizer
    if is_multi_optimizer(optimizer):
        _distribute_multi(optimizer)
        return optimizer
    if horovod_compat.is_horovod_optimizer(optimizer):
        # the user's hvd.DistributedOptimizer (learning rate scaled by them, as Merlin asks)
        # would allreduce the shards too: the same optimizer, with the block's rules instead
        inner = horovod_compat.unwrapped(optimizer)
    else:
        inner = scaled_optimizer(optimizer, comm.size())
    out = horovod_compat.distributed_optimizer(
        inner, is_local, prefix=prefix, merged=complete_waiting
    )
    out._mmde_distributed = True  # noqa: SLF001 (our own mark on the optimizer)
    return out


def _distribute_multi(multi) -> None:
    """Merlin's train step calls ``minimize`` on the MultiOptimizer, so the gradients are
    averaged where it computes them (once for all its optimizers, in one grouped allreduce);
    the optimizers inside only get the scaled learning rate."""
    done: dict = {}  # one optimizer given for several groups stays one optimizer

    def scaled(opt):
        if id(opt) not in done:
            done[id(opt)] = scaled_optimizer(opt, comm.size())
        return done[id(opt)]

    for pair in list(multi.optimizers_and_blocks) + list(multi.update_optimizers_and_blocks):
        new = scaled(pair.optimizer)
        keras_compat.retrack(multi, pair.optimizer, new)
        pair.optimizer = new
    multi.default_optimizer = scaled(multi.default_optimizer)
    keras_compat.wrap_compute_gradients(multi, average_over_ranks)
    multi._mmde_distributed = True  # noqa: SLF001 (our own mark on the optimizer)


@tf.autograph.experimental.do_not_convert
def average_over_ranks(grads_and_vars, prefix: str = "mmde_grad_multi") -> list:
    """Global gradients averaged over ranks (one grouped allreduce); local ones (shards,
    sparse or not) divided by N, as Horovod's ``scale_local_gradients`` does. Rows whose
    backward waited (``backends/step.py``) go back first, with the float32 global
    gradients when they may."""
    pairs, n = list(grads_and_vars), comm.size()
    variables = [v for _, v in pairs]
    grads, done = complete_waiting(
        [g for g, _ in pairs], variables, [is_local(v) for v in variables], f"{prefix}_merged"
    )
    pairs = list(zip(grads, variables))
    shared = [
        i for i, (g, v) in enumerate(pairs) if g is not None and not is_local(v) and not done[i]
    ]
    averaged = comm.average_gradients([pairs[i][0] for i in shared], prefix)
    out = list(pairs)
    for i, grad in zip(shared, averaged):
        out[i] = (grad, pairs[i][1])
    for i, (grad, var) in enumerate(pairs):
        if grad is not None and is_local(var):
            out[i] = (horovod_compat.scaled_local_gradient(grad, float(n)), var)
    return out


# why the 16-bit checks below refuse other optimizers (one sentence of their errors)
_ROUNDED_BY_ROWWISE_ONLY = (
    "its rows are updated in float32 and stochastically rounded by "
    "merlin_models_de.RowWiseAdagrad only."
)


def check_table_dtype(model, optimizer) -> None:
    """Raises ValueError naming the table, its dtype and the optimizer when a block of
    ``model`` stores trainable tables in 16 bits and ``optimizer`` (what ``compile`` is
    given: an optimizer, a name, a MultiOptimizer) would train them with one that cannot
    update 16-bit rows (Keras' optimizers would round every update to nearest, losing the
    small ones, and keep their state in 16 bits too). Reads only the block's plan and
    options, which every rank shares, and changes nothing."""
    for block in embedding_blocks(model):
        if block.table_dtype is None or not is_narrow(block.table_dtype) or not block.trainable:
            continue
        narrow = [t.name for t in block.tables if block.plan.kind_of(t.name) in MODEL_PARALLEL]
        if not narrow:  # every table replicated: stored in the block's dtype
            continue
        trains = optimizer_of(keras_optimizer(optimizer), block)
        if trains is None or isinstance(trains, RowWiseAdagrad):
            continue
        table = narrow[0]
        raise ValueError(
            f"Table '{table}' of block '{block.name}' is stored in {block.table_dtype} "
            f"(table_dtype={block.table_dtype!r}); {_ROUNDED_BY_ROWWISE_ONLY} Compile with it "
            "(or give it the block through mm.MultiOptimizer), or use table_dtype=None. "
            f"Received: optimizer={type(trains).__name__}"
        )


def check_updated_tables(optimizer, variables) -> None:
    """Raises ValueError naming the variable, its dtype and the optimizer when ``optimizer``
    is about to update a table shard stored in 16 bits and is not :class:`RowWiseAdagrad`:
    what :func:`check_table_dtype` refuses at ``compile``, for loops that call an optimizer
    themselves. The same variables and optimizer on every rank: every rank raises."""
    trains = _unwrapped(optimizer)
    if isinstance(trains, RowWiseAdagrad):
        return
    for var in variables:
        if is_local(var) and is_narrow(var.dtype):
            raise ValueError(
                f"Variable '{var.name}' is a table shard stored in {var.dtype.name}; "
                f"{_ROUNDED_BY_ROWWISE_ONLY} Apply its gradients with it (or build the block "
                "with table_dtype=None). "
                f"Received: optimizer={type(trains).__name__}"
            )


def _unwrapped(optimizer):
    """``optimizer`` without Keras' loss-scale wrapper."""
    return getattr(optimizer, "inner_optimizer", None) or optimizer


def optimizer_of(optimizer, block):
    """The optimizer that trains ``block``'s tables: ``optimizer`` itself, or in Merlin's
    MultiOptimizer the one given the block (later ``update`` calls win), else its default."""
    optimizer = _unwrapped(optimizer)
    if not is_multi_optimizer(optimizer):
        return optimizer
    found = optimizer.default_optimizer
    pairs = list(optimizer.optimizers_and_blocks) + list(optimizer.update_optimizers_and_blocks)
    for pair in pairs:
        if any(b is block or block in embedding_blocks(b) for b in pair.blocks):
            found = pair.optimizer
    return found
