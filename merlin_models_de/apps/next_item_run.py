"""The run behind ``python -m merlin_models_de.apps.next_item`` (imports TensorFlow and Merlin).

Each epoch is one ``model.fit(..., pre=SequencePredictLast)`` and one ``model.evaluate`` on
held-out sessions (Merlin applies ``pre`` to fit's own validation data only as training
data, so evaluation is its own call). Merlin retraces the step at every such call, so speed
is measured from the end of each epoch's first step to the end of its last.
"""
from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.dlrm_report import embedding_bytes, peak_rss_bytes
from merlin_models_de.apps.dlrm_run import _optimizer, configure_threads
from merlin_models_de.apps.next_item_data import make_sessions, session_schema
from merlin_models_de.apps.synthetic import rank_rows
from merlin_models_de.tables import human_bytes

ITEM = "item_id"
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


def sessions_dataset(sessions: dict, batch: int) -> tf.data.Dataset:
    """Full batches of sessions as Merlin's Loader gives a list column: ``item_id__values``
    and ``item_id__offsets``."""
    seq = tf.RaggedTensor.from_row_lengths(sessions["values"], sessions["lengths"])

    def loader_form(s):
        return {f"{ITEM}__values": s.flat_values, f"{ITEM}__offsets": s.row_splits}

    return (tf.data.Dataset.from_tensor_slices(seq).batch(batch, drop_remainder=True)
            .map(loader_form).prefetch(2))


def _data(args, size, rank):
    valid = args.valid_sessions
    if valid is None:
        valid = max(args.sessions // 10, args.batch_size * size)

    def local(total, seed):
        ranges = rank_rows(total, args.batch_size, size, rank)
        return make_sessions(args.items, args.max_length, ranges, seed), len(ranges)

    train, steps = local(args.sessions, args.seed)
    held_out, valid_steps = local(valid, args.seed + 1) if valid else (None, 0)
    return train, steps, held_out, valid_steps


def _model(args, schema):
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    if args.embeddings == "merlin":
        emb = mm.Embeddings(schema, dim=args.dim, sequence_combiner=None)
    else:
        emb = mm.DistributedEmbeddings(
            schema, dim=args.dim, sequence_combiner=None, strategy=args.strategy,
            column_slice_threshold=args.column_slice_threshold,
            row_slice_threshold=args.row_slice_threshold,
            data_parallel_threshold=args.data_parallel_threshold, backend=args.backend,
            validate_ids=args.validate_ids)
    hidden = args.hidden or args.dim
    if args.encoder == "gru":
        encoder = [LastState(hidden)]
    else:
        encoder = [mm.MLPBlock([hidden]),
                   mm.GPT2Block(d_model=hidden, n_head=args.heads, n_layer=args.layers),
                   LastPosition()]
    model = mm.Model(mm.InputBlockV2(schema, categorical=emb), *encoder,
                     mm.MLPBlock(list(args.mlp) + [args.dim]),
                     mm.CategoricalOutput(to_call=emb[ITEM]))
    return model, emb


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


def _evaluate(model, valid, pre, epoch):
    """Evaluate's loss and top-k metrics, the mean over the ranks (equal sessions each)."""
    result = model.evaluate(valid, verbose=0, return_dict=True, pre=pre)
    mine = {k: float(v) for k, v in result.items()}
    ranks = comm.allgather_object(mine, name=f"mmde_next_item_eval{epoch}")
    return {k: sum(r[k] for r in ranks) / len(ranks) for k in mine}


def _line(e) -> str:
    mem = " ".join(f"r{i}={human_bytes(b)}/{human_bytes(r)}"
                   for i, (b, r) in enumerate(zip(e["embedding_bytes"], e["peak_rss_bytes"])))
    sps = "" if e["samples_per_second"] is None else f"{e['samples_per_second']:,.0f} samples/s "
    val = "" if e["val"] is None else " " + " ".join(
        f"val_{k}={e['val'][k]:.4f}" for k in ("loss",) + METRICS if k in e["val"])
    return (f"epoch {e['epoch']}: {sps}({e['train_seconds']:.2f} s) loss={e['loss']:.4f}{val} "
            f"embeddings/peak RSS per rank: {mem}")


def _placement(emb, args) -> str:
    if hasattr(emb, "plan"):
        return emb.summary(optimizer=args.optimizer)
    return (f"mm.Embeddings, data parallel: each of {comm.size()} ranks holds the item table "
            f"({human_bytes(embedding_bytes(emb))}) and computes the full softmax")


def run(args, started: float) -> dict:
    """Trains and evaluates as ``args`` say; returns the report (rank 0 writes it)."""
    threads = configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # initializes Horovod under horovodrun

    phases = {"imports": time.perf_counter() - started}
    size, rank = comm.size(), comm.rank()
    global_batch = args.batch_size * size
    schema = session_schema(args.items, args.max_length, ITEM)
    train, steps, held_out, valid_steps = _data(args, size, rank)
    train_ds = sessions_dataset(train, args.batch_size)
    valid_ds = sessions_dataset(held_out, args.batch_size) if held_out is not None else None
    phases["data"] = time.perf_counter() - started
    tf.keras.utils.set_random_seed(args.seed + rank)
    model, emb = _model(args, schema)
    model.compile(optimizer=_optimizer(args))
    pre = mm.SequencePredictLast(schema=schema, target=ITEM)
    if rank == 0:
        print(_placement(emb, args), flush=True)
    epochs = []
    for epoch in range(args.epochs):
        clock = StepClock()
        history = model.fit(train_ds, epochs=1, steps_per_epoch=steps, pre=pre,
                            callbacks=[clock], verbose=0 if (args.quiet or rank) else 2)
        phases.setdefault("first_epoch_trained", time.perf_counter() - started)
        sps, seconds = clock.warm(global_batch)
        loss = float(history.history["loss"][-1])
        val = _evaluate(model, valid_ds, pre, epoch) if valid_ds is not None else None
        mine = {"embedding_bytes": embedding_bytes(emb), "peak_rss_bytes": peak_rss_bytes(),
                "loss": loss, "samples_per_second": sps}
        ranks = comm.allgather_object(mine, name=f"mmde_next_item_epoch{epoch}")
        speeds = [r["samples_per_second"] for r in ranks]
        entry = {"epoch": epoch + 1, "steps": clock.steps, "train_seconds": seconds,
                 # every rank steps together: the slowest rank's clock is the job's
                 "samples_per_second": None if None in speeds else min(speeds),
                 "loss": sum(r["loss"] for r in ranks) / len(ranks), "val": val,
                 "embedding_bytes": [r["embedding_bytes"] for r in ranks],
                 "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks]}
        epochs.append(entry)
        if rank == 0:
            print(_line(entry), flush=True)
    phases["done"] = time.perf_counter() - started
    report = _report(args, emb, epochs, steps, valid_steps, threads, phases)
    if args.report and rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"Report: {args.report}")
    comm.barrier(name="mmde_next_item_done")
    return report


def _report(args, emb, epochs, steps, valid_steps, threads, phases) -> dict:
    plan = getattr(emb, "plan", None)
    speeds = [e["samples_per_second"] for e in epochs if e["samples_per_second"] is not None]
    last = epochs[-1]
    return {"command": "merlin_models_de.apps.next_item", "options": vars(args),
            "world_size": comm.size(), "cpu_threads": threads,
            "backend": getattr(emb, "backend_name", "mm.Embeddings"),
            "steps_per_epoch": steps, "valid_steps": valid_steps,
            "global_batch": args.batch_size * comm.size(), "phases": phases,
            # warm: every epoch's steps after its first (which traces the step)
            "warm_samples_per_second": sum(speeds) / len(speeds) if speeds else None,
            "total_embedding_bytes": args.items * args.dim * 4,
            "item_table_kind": plan.kind_of(ITEM).name if plan is not None else "DATA_PARALLEL",
            "final_loss": last["loss"],
            "val": last["val"], "epochs": epochs,
            "plan": plan.to_dict() if plan is not None else None}
