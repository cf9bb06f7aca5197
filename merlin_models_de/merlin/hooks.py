"""Merlin Models integration: compile / fit / evaluate / predict / save under horovodrun.

Merlin's ``BaseModel`` wraps the optimizer in ``hvd.DistributedOptimizer`` (learning rate
times world size), adds ``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` to ``fit`` and
saves only on rank 0. Left alone, each of these corrupts or loses sharded tables. For models
that contain a ``DistributedEmbeddings`` block, on more than one rank, the hooks below
(installed by :func:`merlin_models_de.compat.merlin.install_merlin_hooks`) adjust:

- compile: the same optimizer and learning-rate scaling as Merlin, but sharded tables (and
  their slots) are registered as local: never allreduced, their gradients divided by the
  world size; data-parallel tables are allreduced dense; allreduces get rank-independent
  names so graph-mode steps cannot deadlock.
- fit / evaluate / predict: a Merlin ``Dataset`` given to them is read by a ``Loader`` made
  under the data rules (a partition a rank at least, ``drop_last=True`` unless given), and
  every rank is checked to run the same number of equal batches before the first step.
- fit: with a ``tf.data`` input each step also sends the next batch's ids
  (:mod:`merlin_models_de.block.ahead`); Merlin's broadcast callback is replaced by one that skips local variables and slots;
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

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.runtime import agree
from merlin_models_de.compat import horovod as horovod_compat
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.compat import merlin as merlin_compat
from merlin_models_de.persistence.export import save_single_process
from merlin_models_de.block import ahead
# The block and the outputs import merlin.models.tf, whose import installs these hooks
# (merlin/register.py): they are imported where used, so that first import never cycles.
from merlin_models_de.merlin.id_report import report_for
from merlin_models_de.merlin.input import rank_loader
from merlin_models_de.merlin.optimizers import distributed, is_multi_optimizer, slot_copies
from merlin_models_de.variables import embedding_blocks, local_slot_refs


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Broadcasts rank ``root_rank``'s global variables and optimizer state after the first
    batch (as Horovod's callback does), skipping sharded tables and their slots."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank, self.done = root_rank, False

    def on_batch_end(self, batch, logs=None):
        if self.done:
            return
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


def _merlin_dataset(data):
    """The Merlin ``Dataset`` that ``data`` reads (itself, or a ``Loader``'s), else None."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    if isinstance(data, mm.Loader):
        return data.dataset
    return data if isinstance(data, Dataset) else None


def partitions_problem(method, data):
    """Why ``data`` (a Merlin ``Dataset`` or ``Loader``) cannot feed every rank, or None.

    Merlin's ``Loader`` deals whole partitions to the ranks; with fewer partitions than ranks
    it fails with a bare ``IndexError`` (and a warning that suggests fewer processes)."""
    import merlin.models.tf as mm

    dataset = _merlin_dataset(data)
    ranks = data.global_size if isinstance(data, mm.Loader) else comm.size()
    if dataset is None or dataset.npartitions >= ranks:
        return None
    return (f"{method}: the dataset has {dataset.npartitions} partition(s) for {ranks} ranks; "
            "Merlin's Loader gives each rank whole partitions, so a rank would get no data. "
            f"Repartition it to a multiple of {ranks} before making the loader: "
            f"ds = ds.repartition(npartitions={ranks}), then mm.Loader(ds, batch_size=B, "
            "drop_last=True) so that every rank runs the same number of equal batches.")


def batch_count(data):
    """Batches ``data`` gives per epoch where that is known without reading it (a Merlin
    ``Loader``, a Keras ``Sequence``, a ``tf.data.Dataset`` of known cardinality), else
    None. A Merlin ``Loader`` must have a partition for this rank (see
    :func:`partitions_problem`)."""
    import merlin.models.tf as mm

    if isinstance(data, tf.data.Dataset):
        count = int(data.cardinality())
        return count if count >= 0 else None
    if isinstance(data, (mm.Loader, tf.keras.utils.Sequence)):
        try:
            return len(data)
        except TypeError:  # over data of unknown length
            return None
    return None


def last_batch_rows(data):
    """Rows of a Merlin ``Loader``'s short last batch on this rank (0: none, with
    ``drop_last=True`` or a multiple of the batch size), None for other data."""
    import merlin.models.tf as mm

    if not isinstance(data, mm.Loader):
        return None
    return 0 if data.drop_last else merlin_compat.loader_rows(data) % data.batch_size


class MerlinHooks:
    """What changes in Merlin's ``BaseModel`` for models with the block on several ranks."""

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

    @staticmethod
    def check_batches(model, method, data, steps):
        """Raises on every rank, before any step, when the ranks would not run the same
        number of equal batches: each step exchanges embeddings across ranks, so a rank that
        ran out of batches would leave the others waiting in a collective, and a short last
        batch on one rank fails that step. Checked: a Merlin dataset with fewer partitions
        than ranks, batch counts, and a Merlin ``Loader``'s last batch without
        ``drop_last``. Unknown counts are not checked."""
        del model
        def count():
            problem = partitions_problem(method, data)
            if problem is not None:
                raise ValueError(problem)  # the same on every rank: each raises its own
            if steps is not None:
                return int(steps), None
            found = batch_count(data)
            return (-1 if found is None else int(found)), last_batch_rows(data)

        _, shapes = agree.on_every_rank(f"{method}: counting each rank's batches", count,
                                        share=lambda c: c, error_type=ValueError)
        counts = [c for c, _ in shapes]
        given = "steps_per_epoch" if method == "fit" else "steps"
        known = [c for c in counts if c >= 0]
        if len(known) == len(counts) and len(set(known)) > 1:
            raise ValueError(
                f"{method}: every rank must run the same number of batches (each step "
                f"exchanges embeddings across ranks). Batches per rank: "
                f"{dict(enumerate(counts))}. Give every rank the same number of equal "
                f"batches (ds.repartition(npartitions=N) with N a multiple of {len(counts)}, "
                f"partitions of equal size, mm.Loader(..., drop_last=True)), or pass "
                f"{given}={min(known)}.")
        lasts = [last for _, last in shapes]
        if None not in lasts and len(set(lasts)) > 1:
            raise ValueError(
                f"{method}: the ranks' last batches differ in size (each step exchanges "
                f"embeddings across ranks, so every rank's batch must be equal). Rows in the "
                f"last batch per rank: {dict(enumerate(lasts))}. Make the loader with "
                f"mm.Loader(ds, batch_size=B, drop_last=True), or pass "
                f"{given}={max(min(known) - 1, 0)}.")

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
        ahead.forget(model)
        return ahead.pipelined(model, data)

    step_inputs = staticmethod(ahead.stashed)  # the exchanged ids, out of the batch

    @staticmethod
    def evaluate(original, model, *args, **kwargs):
        return sync_metric_results(model, original(model, *args, **kwargs))

    @staticmethod
    def fit_callbacks(model, callbacks):
        callbacks = [BroadcastGlobalVariablesCallback(0)
                     if horovod_compat.is_horovod_broadcast_callback(c) else c for c in callbacks]
        report = report_for(model)  # validate_ids=False: the epoch's ids outside their tables
        return callbacks + [report] if report is not None else callbacks

    @staticmethod
    def rebuild_scope():
        """Tied outputs rebuilt inside bind their own model's tables (named_tables)."""
        from merlin_models_de.block.handles import named_tables

        return named_tables()

    @staticmethod
    def save(original, model, *args, **kwargs):
        return save_single_process(model, original, *args, **kwargs)


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
            f"candidates={type(candidates).__name__}")
    return None


def install() -> None:
    """Installs :class:`MerlinHooks` and the tied-output translation into Merlin (idempotent;
    inert for other models)."""
    merlin_compat.install_merlin_hooks(MerlinHooks)
    merlin_compat.install_output_hooks(_is_table_handle, _tie_to_handle)
    merlin_compat.install_top_k_encoder_hook(top_k_encoder_layer)


def _is_table_handle(to_call) -> bool:
    from merlin_models_de.block.handles import TableHandle

    return isinstance(to_call, TableHandle)


def _tie_to_handle(output_cls, to_call, kwargs):
    from merlin_models_de.outputs.tied import tie_to_handle

    return tie_to_handle(output_cls, to_call, kwargs)
