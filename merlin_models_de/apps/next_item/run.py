"""The run behind ``python -m merlin_models_de.apps.next_item`` (imports TensorFlow and Merlin).

Each epoch is one ``model.fit(..., pre=SequencePredictLast)`` and one ``model.evaluate`` on
held-out sessions (Merlin applies ``pre`` to fit's own validation data only as training
data, so evaluation is its own call). Merlin retraces the step at every such call, so speed
is measured from the end of each epoch's first step to the end of its last.
"""

from __future__ import annotations

import time

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.common.checkpoints import checkpoint_callback, restore_for
from merlin_models_de.apps.common.cores import configure_threads
from merlin_models_de.apps.common.dynamic import counters_text, dynamic_tables
from merlin_models_de.apps.common.epochs import RestOfEpoch, equal_steps_for
from merlin_models_de.apps.common.optimizers import optimizer_for
from merlin_models_de.apps.common.options import exchange_of, placement_of
from merlin_models_de.apps.common.reports import (
    embedding_bytes,
    huge_page_bytes,
    peak_rss_bytes,
    write_report,
)
from merlin_models_de.apps.common.synthetic import rank_rows
from merlin_models_de.apps.next_item.data import (
    CATEGORY,
    ITEM,
    categories_of,
    make_sessions,
    session_schema,
)
from merlin_models_de.tables import human_bytes

METRICS = ("recall_at_10", "ndcg_at_10", "mrr_at_10")


class LastPosition(tf.keras.layers.Layer):
    """``[B, None, d]`` ragged (or dense) sequence -> ``[B, d]``: each session's last state."""

    def call(self, inputs):
        if isinstance(inputs, tf.RaggedTensor):
            return tf.gather(inputs.flat_values, inputs.row_splits[1:] - 1)
        return inputs[:, -1]


class LastState(tf.keras.layers.Layer):
    """A GRU over the ragged ``[B, None, d]`` item vectors -> its last state ``[B, units]``
    (Keras' GRU masks ragged input by the row lengths)."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.gru = tf.keras.layers.GRU(units)

    def call(self, inputs):
        return self.gru(inputs)

    def get_config(self):
        return dict(super().get_config(), units=self.units)


def sessions_dataset(sessions: dict, batch: int, item: str, categories: int = 0) -> tf.data.Dataset:
    """Full batches of sessions as Merlin's Loader gives a list column: ``<item>__values``
    and ``<item>__offsets`` (and with ``categories`` the items' categories, ``category__*``)."""
    seq = tf.RaggedTensor.from_row_lengths(sessions["values"], sessions["lengths"])
    columns = {item: seq}
    if categories:
        columns[CATEGORY] = tf.RaggedTensor.from_row_lengths(
            categories_of(sessions["values"], categories), sessions["lengths"]
        )

    def loader_form(cols):
        out = {}
        for name, s in cols.items():
            out[f"{name}__values"], out[f"{name}__offsets"] = s.flat_values, s.row_splits
        return out

    return (
        tf.data.Dataset.from_tensor_slices(columns)
        .batch(batch, drop_remainder=True)
        .map(loader_form)
        .prefetch(2)
    )


def synthetic_data(args, size, rank):
    """(schema, train data, steps, valid data or None, valid steps): this rank's sessions."""
    valid = args.valid_sessions
    if valid is None:
        valid = max(args.sessions // 10, args.batch_size * size)

    def local(total, seed):
        ranges = rank_rows(total, args.batch_size, size, rank)
        sessions = make_sessions(args.items, args.max_length, ranges, seed)
        return sessions_dataset(sessions, args.batch_size, ITEM, args.categories), len(ranges)

    train, steps = local(args.sessions, args.seed)
    held_out, valid_steps = local(valid, args.seed + 1) if valid else (None, 0)
    schema = session_schema(args.items, args.max_length, ITEM, args.categories)
    return schema, train, steps, held_out, valid_steps


def parquet_data(args, size, rank):
    """(schema, train loader, steps, valid loader, valid steps): Merlin's Loader over this
    rank's partitions of ``--train-dir`` / ``--valid-dir``, reading the item column only."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    from merlin_models_de.apps.next_item.data import item_model_schema

    del rank  # the Loader finds it (below)
    from merlin_models_de.apps.common.schemas import load_schema

    def loader(path):
        schema = item_model_schema(load_schema(path), args.item_column)
        ds = Dataset(path, engine="parquet", schema=schema)
        if ds.npartitions < size:  # the loader deals whole partitions to the ranks
            ds = ds.repartition(npartitions=size)
        # under Horovod Merlin's Loader takes this rank's partitions by itself (its world
        # size and rank default to Horovod's)
        return schema, mm.Loader(ds, batch_size=args.batch_size, shuffle=False, drop_last=True)

    schema, train = loader(args.train_dir)
    valid = loader(args.valid_dir)[1]
    return (schema, train, equal_steps_for(train, "train"), valid, equal_steps_for(valid, "valid"))


def model_for(args, schema):
    """(model, embedding block, the model whose evaluate gives full-catalog top-k: the model
    itself with the softmax, else a twin sharing its layers with a full-softmax output)."""
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    if args.embeddings == "merlin":
        emb = mm.Embeddings(schema, dim=args.dim, sequence_combiner=None)
    else:
        emb = mm.DistributedEmbeddings(
            schema,
            dim=args.dim,
            sequence_combiner=None,
            placement=placement_of(args),
            exchange=exchange_of(args),
            dynamic_tables=dynamic_tables(args, schema),
        )
    hidden = args.hidden or args.dim
    if args.encoder == "gru":
        encoder = [LastState(hidden)]
    else:
        encoder = [
            mm.MLPBlock([hidden]),
            mm.GPT2Block(d_model=hidden, n_head=args.heads, n_layer=args.layers),
            LastPosition(),
        ]
    body = [
        mm.InputBlockV2(schema, categorical=emb),
        *encoder,
        mm.MLPBlock(list(args.mlp) + [args.dim]),
    ]
    item = emb[args.item_column]
    if args.loss == "softmax":
        model = mm.Model(*body, mm.CategoricalOutput(to_call=item))
        return model, emb, model
    from merlin_models_de.outputs.samplers import GlobalInBatchSampler

    # the sampled loss: every rank's in-batch positives are the negatives (what one process
    # with the global batch does); its evaluate ranks the target among those candidates only
    model = mm.Model(
        *body, mm.ContrastiveOutput(to_call=item, negative_samplers=GlobalInBatchSampler())
    )
    return model, emb, mm.Model(*body, mm.CategoricalOutput(to_call=item))


class StepClock(tf.keras.callbacks.Callback):
    """Times one fit call's steps; the first (which traces the step) is timed apart."""

    def __init__(self):
        super().__init__()
        self.begin = self.first = self.last = None
        self.steps = 0
        self._supports_tf_logs = True  # no per-step numpy copy of the logs

    def on_train_batch_begin(self, batch, logs=None):
        if self.begin is None:
            self.begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.last = time.perf_counter()
        self.steps += 1
        if self.first is None:
            self.first = self.last

    def warm(self, global_batch: int) -> tuple[float | None, float]:
        """(samples/s after the first step or None with one step, seconds of all steps)."""
        seconds = self.last - self.begin
        if self.steps < 2:
            return None, seconds
        return (self.steps - 1) * global_batch / (self.last - self.first), seconds


def evaluate_catalog(model, valid, steps, pre, epoch):
    """Evaluate's loss and top-k metrics, the mean over the ranks (equal sessions each)."""
    result = model.evaluate(valid, steps=steps, verbose=0, return_dict=True, pre=pre)
    mine = {k: float(v) for k, v in result.items()}
    ranks = comm.allgather_object(mine, name=f"mmde_next_item_eval{epoch}")
    return {k: sum(r[k] for r in ranks) / len(ranks) for k in mine}


def _line(e) -> str:
    mem = " ".join(
        f"r{i}={human_bytes(b)}/{human_bytes(r)}"
        for i, (b, r) in enumerate(zip(e["embedding_bytes"], e["peak_rss_bytes"]))
    )
    sps = "" if e["samples_per_second"] is None else f"{e['samples_per_second']:,.0f} samples/s "
    val = "".join(
        f" {prefix}_{k}={e[key][k]:.4f}"
        for key, prefix in (("val", "val"), ("val_sampled", "val_sampled"))
        if e.get(key)
        for k in ("loss",) + METRICS
        if k in e[key]
    )
    dynamic = counters_text(e.get("dynamic_tables", {}))
    return (
        f"epoch {e['epoch']}: {sps}({e['train_seconds']:.2f} s) loss={e['loss']:.4f}{val} "
        f"embeddings/peak RSS per rank: {mem}{dynamic}"
    )


def _placement(emb, args) -> str:
    if hasattr(emb, "plan"):
        return emb.summary(optimizer=args.optimizer)
    return (
        f"mm.Embeddings, data parallel: each of {comm.size()} ranks holds the item table "
        f"({human_bytes(embedding_bytes(emb))}) and computes the full softmax"
    )


def _resume(args, model, schema, steps, size):
    """``(first epoch, its batches trained already, what the report records)``: from the
    newest checkpoint in ``--checkpoint-dir`` (as the DLRM command resumes), else a fresh
    start."""
    from merlin_models_de.persistence.checkpoint import latest_checkpoint
    from merlin_models_de.persistence.export import sample_batch

    if not (args.checkpoint_dir and latest_checkpoint(args.checkpoint_dir)):
        return 0, 0, None
    model(sample_batch(schema))  # restoring writes into the variables: create them first
    return restore_for(args, model, steps, size)


def _rest_of_epoch(train, skip: int, steps: int):
    """The epoch's batches after its first ``skip`` (all of them when ``skip`` is 0)."""
    if not skip:
        return train
    if isinstance(train, tf.data.Dataset):
        return train.skip(skip)
    return RestOfEpoch(train, skip, steps)  # Merlin's Loader


def run(args, started: float) -> dict:
    """Trains and evaluates as ``args`` say; returns the report (rank 0 writes it)."""
    threads = configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # Horovod is up: configure_threads or this

    phases = {"imports": time.perf_counter() - started}
    size, rank = comm.size(), comm.rank()
    global_batch = args.batch_size * size
    data = parquet_data if args.train_dir else synthetic_data
    schema, train_ds, steps, valid_ds, valid_steps = data(args, size, rank)
    phases["data"] = time.perf_counter() - started
    tf.keras.utils.set_random_seed(args.seed + rank)
    model, emb, catalog_model = model_for(args, schema)
    model.compile(optimizer=optimizer_for(args))
    if catalog_model is not model:  # evaluate only; its optimizer never steps
        catalog_model.compile(optimizer=optimizer_for(args))
    pre = mm.SequencePredictLast(schema=schema, target=args.item_column)
    start, done, resumed = _resume(args, model, schema, steps, size)
    if rank == 0:
        print(_placement(emb, args), flush=True)
    saver = checkpoint_callback(args)
    epochs = []
    for epoch in range(start, args.epochs):
        clock = StepClock()
        skip = done if epoch == start else 0  # a resumed epoch: only its untrained batches
        history = model.fit(
            _rest_of_epoch(train_ds, skip, steps),
            epochs=1,
            steps_per_epoch=steps - skip,
            pre=pre,
            callbacks=[clock] + ([saver] if saver else []),
            verbose=0,
        )  # the command prints one line per epoch itself
        phases.setdefault("first_epoch_trained", time.perf_counter() - started)
        sps, seconds = clock.warm(global_batch)
        loss = float(history.history["loss"][-1])
        val = sampled = None
        if valid_ds is not None:
            val = evaluate_catalog(catalog_model, valid_ds, valid_steps, pre, f"{epoch}")
            if catalog_model is not model:  # the sampled loss's own evaluate, for reference
                sampled = evaluate_catalog(model, valid_ds, valid_steps, pre, f"{epoch}_sampled")
        mine = {
            "embedding_bytes": embedding_bytes(emb),
            "peak_rss_bytes": peak_rss_bytes(),
            "huge_page_bytes": huge_page_bytes(),
            "loss": loss,
            "samples_per_second": sps,
        }
        ranks = comm.allgather_object(mine, name=f"mmde_next_item_epoch{epoch}")
        # dynamic tables: keys holding a row, admitted and evicted so far (collective)
        counters = emb.dynamic_counters() if hasattr(emb, "dynamic_counters") else {}
        speeds = [r["samples_per_second"] for r in ranks]
        entry = {
            "epoch": epoch + 1,
            "steps": clock.steps,
            "train_seconds": seconds,
            # every rank steps together: the slowest rank's clock is the job's
            "samples_per_second": None if None in speeds else min(speeds),
            "loss": sum(r["loss"] for r in ranks) / len(ranks),
            "val": val,
            "val_sampled": sampled,
            "embedding_bytes": [r["embedding_bytes"] for r in ranks],
            "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
            "huge_page_bytes": [r["huge_page_bytes"] for r in ranks],
        }
        if counters:
            entry["dynamic_tables"] = counters
        epochs.append(entry)
        if rank == 0:
            print(_line(entry), flush=True)
    phases["done"] = time.perf_counter() - started
    report = _report(args, emb, epochs, steps, valid_steps, threads, phases)
    report["resumed"] = resumed
    write_report(args.report, report)
    comm.barrier(name="mmde_next_item_done")
    return report


def _report(args, emb, epochs, steps, valid_steps, threads, phases) -> dict:
    plan = getattr(emb, "plan", None)
    speeds = [e["samples_per_second"] for e in epochs if e["samples_per_second"] is not None]
    last = epochs[-1] if epochs else {"loss": None, "val": None}  # resumed when done
    return {
        "command": "merlin_models_de.apps.next_item",
        "options": vars(args),
        "world_size": comm.size(),
        "cpu_threads": threads,
        "backend": getattr(emb, "backend_name", "mm.Embeddings"),
        "steps_per_epoch": steps,
        "valid_steps": valid_steps,
        "global_batch": args.batch_size * comm.size(),
        "phases": phases,
        # warm: every epoch's steps after its first (which traces the step)
        "warm_samples_per_second": sum(speeds) / len(speeds) if speeds else None,
        "total_embedding_bytes": sum(t.rows * t.dim * 4 for t in emb.tables)
        if plan is not None
        else embedding_bytes(emb),
        "item_column": args.item_column,
        "loss": args.loss,
        "item_table_kind": (
            plan.kind_of(emb[args.item_column].name).name if plan is not None else "DATA_PARALLEL"
        ),
        "final_loss": last["loss"],
        # val: full-catalog softmax loss and top-k; val_sampled (--loss sampled): the
        # sampled loss's own evaluate, the target ranked among the global batch's items
        "val": last["val"],
        "val_sampled": last.get("val_sampled"),
        "epochs": epochs,
        "plan": plan.to_dict() if plan is not None else None,
    }
