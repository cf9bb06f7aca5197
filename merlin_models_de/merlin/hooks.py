"""Merlin Models integration: compile / fit / evaluate / predict / save under horovodrun.

Merlin's ``BaseModel`` wraps the optimizer in ``hvd.DistributedOptimizer`` (learning rate
times world size), adds ``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` to ``fit`` and
saves only on rank 0. Left alone, each of these corrupts or loses sharded tables. For models
that contain a ``DistributedEmbeddings`` block, on more than one rank, the hooks below
(installed by :func:`merlin_models_de.compat.merlin_hooks.install_merlin_hooks`) adjust:

- compile: the same optimizer and learning-rate scaling as Merlin, but sharded tables (and
  their slots) are registered as local: never allreduced, their gradients divided by the
  world size; data-parallel tables are allreduced dense; allreduces get rank-independent
  names so graph-mode steps cannot deadlock.
- fit / evaluate / predict: a Merlin ``Dataset`` given to them is read by a ``Loader`` made
  under the data rules (a partition a rank at least, ``drop_last=True`` unless given), and
  every input (``validation_data`` too) is checked to give every rank the same number of
  equal batches before the first step, or made to end on every rank together
  (:mod:`merlin_models_de.merlin.calls`); ranks other than 0 are quiet unless given
  ``verbose``.
- fit: with a ``tf.data`` input each step also sends the next batch's ids (the blocks'
  backends prepare the input), and each traced step opens the values
  its blocks and optimizer share (:mod:`merlin_models_de.backends.step`); Merlin's broadcast
  callback is replaced by one that skips local variables and slots;
  with ``validate_ids=False`` the epoch's ids outside their tables are reported
  (:mod:`merlin_models_de.merlin.id_report`).
- evaluate: metric states are summed over ranks, so results equal one process's.
- save: every rank takes part; rank 0 writes a single-process SavedModel with full tables.
- outputs: ``mm.CategoricalOutput`` / ``mm.ContrastiveOutput`` take ``block[table]`` for
  weight tying, as they take an ``mm.EmbeddingTable`` (:mod:`merlin_models_de.outputs.tied`).

Learning-rate convention (Merlin's): with N ranks, per-rank batch B and learning rate lr,
training equals one process with batch N*B and learning rate N*lr.

Example:
    >>> import merlin_models_de  # the hooks go in with the first block built  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.step import input_pipeline, training_step
from merlin_models_de.compat import horovod as horovod_compat
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.compat import merlin_hooks as merlin_compat
from merlin_models_de.dynamic.reset import optimizer_state
from merlin_models_de.kernels.scatter import adagrad_rows, on_gpu, scatter_in_pieces

# The block and the outputs import merlin.models.tf, whose import installs these hooks
# (merlin/register.py): they are imported where used, so that first import never cycles.
from merlin_models_de.merlin.calls import prepare_call
from merlin_models_de.merlin.id_report import report_for
from merlin_models_de.merlin.input import rank_loader
from merlin_models_de.merlin.input_checks import check_inputs
from merlin_models_de.merlin.optimizers import (
    check_table_dtype,
    check_updated_tables,
    distributed,
    is_multi_optimizer,
    slot_copies,
)
from merlin_models_de.persistence.export import save_single_process
from merlin_models_de.runtime.peers import naming_silent_ranks
from merlin_models_de.variables import (
    embedding_blocks,
    has_row_state,
    is_table,
    local_slot_refs,
)


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Broadcasts rank ``root_rank``'s global variables and optimizer state, skipping sharded
    tables and their slots: when training begins if the model is built (``fit`` made its
    optimizer's slots already), else after the first batch (as Horovod's callback does, once
    the step made the variables). Keras times the batch hooks of the first batches and warns
    about a slow callback when a broadcast runs in one."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank, self.done = root_rank, False

    def on_train_begin(self, logs=None):
        if self.model.built:
            self._broadcast()

    def on_batch_end(self, batch, logs=None):
        if not self.done:
            self._broadcast()

    def _broadcast(self):
        opt = self.model.optimizer
        local = local_slot_refs(opt, self.model.variables)
        global_vars = [v for v in self.model.variables if v.ref() not in local]
        global_vars += [v for v in opt.variables() if v.ref() not in local]
        comm.broadcast_variables(global_vars, root_rank=self.root_rank)
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


class MerlinHooks:
    """What changes in Merlin's ``BaseModel`` for models with the block on several ranks."""

    @staticmethod
    def longest(length, name: str):
        """The largest of every rank's ``length`` (int64 ``[1]``): a transformer's inputs are
        padded to the global batch's longest sequence."""
        return tf.reduce_max(comm.allgather(length, name=name))

    @staticmethod
    def active(model) -> bool:
        """Adjust ``model``? Only with more than one rank and a block inside."""
        return comm.size() > 1 and bool(embedding_blocks(model))

    @staticmethod
    def compile(original, model, optimizer="rmsprop", *args, **kwargs):
        optimizer = distributed(optimizer)
        if is_multi_optimizer(optimizer):  # Merlin would wrap its optimizers once more
            with merlin_compat.optimizer_as_given(model):
                return original(model, optimizer, *args, **kwargs)
        return original(model, optimizer, *args, **kwargs)

    rank_loader = staticmethod(rank_loader)  # a Merlin Dataset given to fit / evaluate / predict
    # fit / evaluate / predict: a collective that failed because a rank went silent names it
    naming_silent_ranks = staticmethod(naming_silent_ranks)

    @staticmethod
    def prepare(model, method, arguments):
        """The call's ``arguments`` (bound by name) made safe on several ranks before any
        step: every input counted and compared across ranks (:mod:`.batches`), inputs of
        unknown length made to end together (:mod:`.ending`), ``verbose`` 0 on ranks other
        than 0 unless given, ``evaluate`` / ``predict``'s report of ids outside their
        tables, and no validation data left from an earlier ``fit`` (Keras keeps it after a
        failed call, and a retry would read it). The blocks' features are checked first
        (:mod:`.input_checks`)."""
        check_inputs(model, method, arguments)
        return prepare_call(model, method, arguments)

    @staticmethod
    def check_inputs(model, method, arguments):
        """In one process, what :meth:`prepare` checks first: the blocks' features of the
        call's input, before Keras traces a step."""
        check_inputs(model, method, arguments)

    @staticmethod
    def before_compile(model, optimizer):
        """Refuses, before Merlin or Keras compile anything, an optimizer (as given: an
        instance, a name such as ``"sgd"``, a MultiOptimizer) that cannot train the blocks'
        16-bit tables: a refused compile leaves the model as it was (its optimizer, a
        MultiOptimizer's optimizers). The plan decides, the same on every rank, so every
        rank refuses."""
        check_table_dtype(model, optimizer)

    @staticmethod
    def after_compile(model):
        """Tells each block the compiled optimizer's slot copies (``block.summary()``)."""
        name, slots = slot_copies(model.optimizer) or (None, None)
        for block in embedding_blocks(model):
            block.compiled_optimizer_name, block.compiled_optimizer_slots = name, slots

    @staticmethod
    def before_fit(model):
        """Creates the optimizer's slots of a built model before Keras traces its train step.
        tf.function traces a function again when its first trace created variables, so slots
        created inside the first step doubled the first step's tracing (a second pass over the
        whole model, its exchanges and its allreduce)."""
        optimizer = getattr(model, "optimizer", None)
        # mixed precision: Keras' loss-scale wrapper passes slot creation to the optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None) or optimizer
        if not model.built or not keras_compat.creates_slots_per_variable(optimizer):
            return  # an unbuilt model creates its weights in the step anyway
        try:
            keras_compat.create_optimizer_slots(optimizer, model.trainable_variables)
        except NotImplementedError:
            pass  # an optimizer whose state Keras cannot create ahead: left to the step

    @staticmethod
    def fit_input(model, data):
        """A ``tf.data`` input brings each step the next batch's ids, to exchange ahead."""
        return input_pipeline(model, data)  # through the blocks' backends

    # each traced train step: its values for the blocks and the optimizer, the next batch's
    # ids out of the batch
    step_inputs = staticmethod(
        lambda model, data: training_step(data, optimizer_state(getattr(model, "optimizer", None)))
    )

    @staticmethod
    def evaluate(original, model, *args, **kwargs):
        return sync_metric_results(model, original(model, *args, **kwargs))

    @staticmethod
    def fit_callbacks(model, callbacks):
        callbacks = [
            BroadcastGlobalVariablesCallback(0)
            if horovod_compat.is_horovod_broadcast_callback(c)
            else c
            for c in callbacks
        ]
        report = report_for(model)  # validate_ids=False: the epoch's ids outside their tables
        return callbacks + [report] if report is not None else callbacks

    @staticmethod
    def rebuild_scope():
        """Tied outputs rebuilt inside bind their own model's tables (named_tables)."""
        from merlin_models_de.block.handles import named_tables

        return named_tables()

    @staticmethod
    def save(original, model, *args, **kwargs):
        if not MerlinHooks.active(model):
            # Keras' SavedModel loader recreates each optimizer slot in its variable's shape,
            # so row state ([rows, 1]) cannot be loaded back: such an optimizer is left out,
            # as N ranks leave every optimizer out (checkpoints hold the training state)
            if has_row_state(getattr(model, "optimizer", None)):
                kwargs["include_optimizer"] = False
            return original(model, *args, **kwargs)
        with uncompiled_load_quiet():  # rank 0 saves an uncompiled single-process copy
            return save_single_process(model, original, *args, **kwargs)


class _NotCompiledNotice(logging.Filter):
    def filter(self, record):
        return "No training configuration found" not in record.getMessage()


@contextlib.contextmanager
def uncompiled_load_quiet():
    """Inside, TensorFlow's logger drops Keras' "No training configuration found ... Compile
    it manually" warning. Merlin's ``save`` loads what it wrote to read its output schema;
    the package saves an uncompiled copy (its optimizer state is the tables' checkpoints'
    business), so that load warned about the package's own save, on rank 0."""
    notice, logger = _NotCompiledNotice(), tf.get_logger()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def top_k_encoder_layer(model, candidates, k):
    """``to_top_k_encoder``'s top-k layer: :class:`~merlin_models_de.outputs.topk.ShardedTopK` over
    an output tied to a sharded table, None for Merlin's own path. Refused on every rank at
    once (no collective needed): encoding a candidate dataset under horovodrun, which
    Merlin does with dask, partition by partition, not in step across ranks."""
    if candidates is None:
        from merlin_models_de.outputs.topk import sharded_top_k_layer

        return sharded_top_k_layer(model.last, k)
    if MerlinHooks.active(model):
        raise ValueError(
            "to_top_k_encoder(candidates) encodes the candidate dataset through the "
            "DistributedEmbeddings block with dask, which does not keep the ranks in step "
            f"({comm.size()} ranks). Save the model (model.save: a single-process copy) and "
            "build the top-k encoder from it in one process, or, for an output tied to the "
            "block's table, call to_top_k_encoder() without candidates. Received: "
            f"candidates={type(candidates).__name__}"
        )
    return None


def install() -> None:
    """Installs :class:`MerlinHooks` and the tied-output translation into Merlin, the
    16-bit tables' optimizer check into plain Keras models' ``compile``, and SGD's and Adagrad's
    sparse updates of tables (idempotent; inert for models without the block)."""
    merlin_compat.install_merlin_hooks(MerlinHooks)
    # plain Keras models holding the block: the same refusal of 16-bit tables' optimizers
    # and what compile gives a vocab-parallel output: Merlin's loss and top-k metrics
    keras_compat.install_compile_check(check_table_dtype, _tied_compile_arguments)
    # and loops that apply gradients themselves, when the optimizer updates a 16-bit table
    keras_compat.install_apply_check(check_updated_tables)
    # SGD's update of a table shard in pieces TF's CPU kernel loops over (see scatter.py)
    keras_compat.install_sgd_pieces(scatter_in_pieces, is_table)
    # and Adagrad's, rows gathered and written back instead of TF's fused row loop
    keras_compat.install_adagrad_rows(adagrad_rows, is_cpu_table_shard)
    merlin_compat.install_output_hooks(_is_table_handle, _tie_to_handle)
    merlin_compat.install_top_k_encoder_hook(top_k_encoder_layer)


def is_cpu_table_shard(var) -> bool:
    """Whether ``var`` holds (a shard of) a table of the block outside a GPU (there Keras'
    fused kernels need no help)."""
    return is_table(var) and not on_gpu(var.device)


def _is_table_handle(to_call) -> bool:
    from merlin_models_de.block.handles import TableHandle

    return isinstance(to_call, TableHandle)


def _tied_compile_arguments(model, arguments):
    from merlin_models_de.outputs.compiled import tied_compile_arguments

    return tied_compile_arguments(model, arguments)


def _tie_to_handle(output_cls, to_call, kwargs):
    from merlin_models_de.outputs.tied import tie_to_handle

    return tie_to_handle(output_cls, to_call, kwargs)
