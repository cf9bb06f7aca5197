"""Merlin Models integration: compile / fit / evaluate / predict / save under horovodrun.

Merlin's ``BaseModel`` wraps the optimizer in ``hvd.DistributedOptimizer`` (learning rate
times world size), adds ``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` to ``fit`` and
saves only on rank 0. Left alone, each of these corrupts or loses sharded tables. For models
that contain a ``DistributedEmbeddings`` block (and only for them) :func:`install` adjusts:

- compile: the same optimizer and learning-rate scaling as Merlin, but sharded tables (and
  their slots) are registered as local: never allreduced, their gradients divided by the
  world size; data-parallel tables are allreduced dense; allreduces get rank-independent
  names so graph-mode steps cannot deadlock.
- fit: Merlin's broadcast callback is replaced by one that skips local variables and slots.
- evaluate: metric states are summed over ranks, so results equal one process's.
- save: every rank takes part; rank 0 writes a single-process SavedModel with full tables.

Learning-rate convention (Merlin's): with N ranks, per-rank batch B and learning rate lr,
training equals one process with batch N*B and learning rate N*lr.

Example:
    >>> import merlin_models_de  # installs this when merlin.models.tf is imported  # doctest: +SKIP
"""
from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.training import is_local, slot, slot_names

_MARK = "_mmde_integration"


def de_blocks(model) -> list:
    """The DistributedEmbeddings blocks inside ``model``."""
    from merlin_models_de.layer import DistributedEmbeddings

    layers = model._flatten_layers(include_self=False, recursive=True)  # pylint: disable=protected-access
    return [m for m in layers if isinstance(m, DistributedEmbeddings)]


def _is_distributed(model) -> bool:
    return comm.size() > 1 and bool(de_blocks(model))


def distributed_optimizer(optimizer):
    """``hvd.DistributedOptimizer`` that knows local variables and names its allreduces
    by position among the allreduced gradients (same on every rank)."""
    comm.hvd()  # initialized
    import horovod.tensorflow.keras as hvd_keras

    wrapped = hvd_keras.DistributedOptimizer(optimizer, sparse_as_dense=True)
    reduce_grads = wrapped._allreduce_grads  # pylint: disable=protected-access
    allreduce = wrapped._allreduce  # pylint: disable=protected-access

    def generic_names(grads, variables=None, use_generic_names=True):
        del use_generic_names
        return reduce_grads(grads, variables, use_generic_names=True)

    def register_then_allreduce(grads, variables):
        for var in variables:
            if is_local(var):
                wrapped.register_local_var(var)
        return allreduce(grads, variables)

    wrapped._allreduce_grads = generic_names  # pylint: disable=protected-access
    wrapped._allreduce = register_then_allreduce  # pylint: disable=protected-access
    return wrapped


def _scaled(optimizer, factor):
    opt = tf.keras.optimizers.get(optimizer, use_legacy_optimizer=True)
    config = opt.get_config()
    lr = opt.learning_rate
    if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
        lr_config = lr.get_config()
        lr_config["initial_learning_rate"] *= factor
        config["learning_rate"] = lr.__class__.from_config(lr_config)
    else:
        config["learning_rate"] = float(tf.keras.backend.get_value(lr)) * factor
    return opt.__class__.from_config(config)


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Broadcasts rank ``root_rank``'s global variables and optimizer state after the first
    batch (as Horovod's callback does), skipping sharded tables and their slots."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank, self.done = root_rank, False

    def on_batch_end(self, batch, logs=None):
        if self.done:
            return
        h = comm.hvd()
        opt = self.model.optimizer
        mine = [v for v in self.model.variables if is_local(v)]
        local = {v.ref() for v in mine}
        local |= {s.ref() for v in mine for name in slot_names(opt)
                  if (s := slot(opt, v, name)) is not None}
        global_vars = [v for v in self.model.variables if v.ref() not in local]
        global_vars += [v for v in opt.variables() if v.ref() not in local]
        if h is not None and global_vars:
            h.broadcast_variables(global_vars, root_rank=self.root_rank)
        self.done = True


def sync_metric_results(model, results):
    """Sums every metric's state over ranks, then recomputes ``evaluate()``'s results.

    Metric states (totals and counts, true/false positives, AUC's confusion matrices) add
    up across ranks, so the results equal one process evaluating all ranks' data.
    """
    index = 0
    for metric in model.metrics:
        for var in metric.variables:
            summed = comm.allreduce(var.read_value(), op="sum", name=f"mmde_metric_{index}")
            var.assign(tf.cast(summed, var.dtype))
            index += 1
    synced = {k: float(v) for k, v in model.get_metrics_result().items()}
    if isinstance(results, dict):
        return {k: synced.get(k, v) for k, v in results.items()}
    if isinstance(results, (list, tuple)):
        return [synced.get(k, v) for k, v in zip(model.metrics_names, results)]
    return synced.get(model.metrics_names[0], results)


def _patch_save(base) -> None:
    """Every Merlin model class that defines ``save`` (they return early on ranks != 0)."""
    import merlin.models.tf.models.base as module

    classes = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, base) and "save" in c.__dict__]
    for cls in classes:
        original = cls.__dict__["save"]

        def save(self, *args, _original=original, **kwargs):
            if not _is_distributed(self):
                return _original(self, *args, **kwargs)
            from merlin_models_de.export import save_single_process

            return save_single_process(self, _original, *args, **kwargs)

        cls.save = save


def install() -> None:
    """Patches Merlin's BaseModel once (idempotent); no effect on models without the block."""
    from merlin.models.tf.models.base import BaseModel

    if getattr(BaseModel, _MARK, False):
        return
    compile_, add_callbacks, evaluate = (
        BaseModel.compile, BaseModel._add_horovod_callbacks,  # pylint: disable=protected-access
        BaseModel.evaluate)

    def compile(self, optimizer="rmsprop", *args, **kwargs):  # pylint: disable=redefined-builtin
        if _is_distributed(self) and not type(optimizer).__module__.startswith("horovod"):
            optimizer = distributed_optimizer(_scaled(optimizer, comm.size()))
        return compile_(self, optimizer, *args, **kwargs)

    def _add_horovod_callbacks(self, callbacks):
        callbacks = add_callbacks(self, callbacks)
        if not _is_distributed(self):
            return callbacks
        import horovod.tensorflow.keras as hvd_keras

        return [BroadcastGlobalVariablesCallback(0)
                if type(c) is hvd_keras.callbacks.BroadcastGlobalVariablesCallback else c
                for c in callbacks]


    def evaluate_(self, *args, **kwargs):
        results = evaluate(self, *args, **kwargs)
        return sync_metric_results(self, results) if _is_distributed(self) else results

    BaseModel.compile = compile
    BaseModel.evaluate = evaluate_
    BaseModel._add_horovod_callbacks = _add_horovod_callbacks  # pylint: disable=protected-access
    _patch_save(BaseModel)
    setattr(BaseModel, _MARK, True)
