"""Where a DLRM training step's time goes, measured piece by piece on a real batch.

``horovodrun -np N python -m merlin_models_de.apps.bench.step_breakdown --part P [dlrm options]``
times separately compiled ``tf.function`` s, each called ``--iterations`` times in a row
after a few warm-up calls, every rank at once (ranks start each piece together):

``--part distributed`` (the DistributedEmbeddings model of the options, horovod backend):

- ``step``: the model's own Keras ``train_step`` (forward, backward, exchanges, dense
  allreduce, optimizer update): the reference the pieces add up to;
- ``ids_exchange``: one all-to-all of int64 with the step's sizes (header + ids per owner);
- ``vectors_forward`` / ``vectors_backward``: the float all-to-alls of the looked-up rows
  and of their gradients, with the step's sizes;
- ``dense_allreduce``: one allreduce per allreduced (non-local) gradient, as Horovod's
  optimizer issues them (Horovod fuses them the same way);
- ``merged_backward`` (in place of the two above, with ``merge_backward`` on, the
  default): the one all-to-all of the rows' gradients and the dense ones
  (``backends/horovod/backward.py``), with the step's sizes;
- ``validation``: the block's id checks (ids inside their tables, batch sizes);
- ``loader``: the input (``--input``: the tf.data pipeline or Merlin's loader) making the next
  batch (in ``fit`` it runs beside the step, in Keras' data thread, on the same cores: not a
  part of ``step``);
- ``call_overhead``: calling an empty ``tf.function``; subtracted from the pieces above
  (inside the step they run in one call).

``--part compute``: the same model and batch with the block in one-process mode (every
table on this rank, no collective, no id validation) and a plain optimizer: forward,
backward and update of one rank's share of the work (B samples through every table equals
N*B lookups in 1/N of the tables), run by every rank at once as in the real step. A separate
launch, because it holds every table once more.

Each piece's time per call is the slowest rank's; the report keeps the median, min and max
over calls. The exchanges are timed on tensors of the step's sizes, not inside the step:
their packing (concat / reshape / split) stays in the step's "other" part. Multi-hot value,
un-pooled and row-sliced exchanges (none in Criteo) are not timed separately.

Example:
    horovodrun -np 2 -H localhost:2 python -m merlin_models_de.apps.bench.step_breakdown \\
        --part distributed --optimizer sgd --batch-size 512 --report part.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

PARTS = ("distributed", "compute")
EXCHANGES = (
    "ids_exchange",
    "vectors_forward",
    "vectors_backward",
    "dense_allreduce",
    "merged_backward",
    "validation",
)


def _parser():
    from merlin_models_de.apps.common.program import program_name
    from merlin_models_de.apps.dlrm.options import parser

    ap = parser(program_name("merlin_models_de.apps.bench.step_breakdown"), __doc__)
    ap.add_argument("--part", choices=PARTS, default="distributed")
    ap.add_argument("--iterations", type=int, default=50, help="timed calls per piece")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls per piece first")
    return ap


def _timed(fn, inputs, args, tag: str) -> list[float]:
    """Seconds of each of ``args.iterations`` calls of ``fn(*inputs)`` after the warm-up;
    every rank starts together (a barrier), so collectives do not wait for a late rank."""
    from merlin_models_de import comm

    for _ in range(args.warmup):
        fn(*inputs)
    comm.barrier(name=f"mmde_breakdown_{tag}")
    seconds = []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        fn(*inputs)
        seconds.append(time.perf_counter() - t0)
    return seconds


def _batch(args, batches: int = 1):
    """(schema, an iterator over this rank's training batches as the command feeds fit
    (``--input``), its first batch: features, targets); the iterator holds ``batches`` more
    (the ids are those of a run, only fewer rows are made)."""
    from merlin_models_de import comm
    from merlin_models_de.apps.dlrm.model import datasets_for

    args.valid_rows = 0
    args.rows = args.batch_size * comm.size() * (batches + 2)
    schema, train, _ = datasets_for(args, comm.size(), comm.rank())
    if hasattr(train, "on_epoch_end"):  # Merlin's loader (--input loader)
        len(train)  # back to its first batch
    batches = iter(train)
    x, y = next(batches)
    return schema, batches, x, y


def _built(args, schema):
    """The DLRM model of ``args`` (block included), built and compiled as the command does."""
    import tensorflow as tf

    from merlin_models_de import comm
    from merlin_models_de.apps.common.optimizers import optimizer_for
    from merlin_models_de.apps.dlrm.model import metrics, model_for
    from merlin_models_de.persistence.export import sample_batch

    tf.keras.utils.set_random_seed(args.seed + comm.rank())
    model, block = model_for(args, schema)
    model(sample_batch(schema))
    model.compile(optimizer=optimizer_for(args, block), metrics=metrics())  # as the command
    return model, block


def _train_step(model):
    import tensorflow as tf

    return tf.function(lambda x, y: model.train_step((x, y))["loss"])


def distributed_pieces(args) -> dict:
    """``{piece: [seconds per call]}`` of the distributed model (see the module docstring)."""
    import tensorflow as tf

    from merlin_models_de import comm
    from merlin_models_de.backends.validate import local_problems, ordered_inputs
    from merlin_models_de.variables import is_local

    schema, train, x, y = _batch(args, args.warmup + args.iterations)
    model, block = _built(args, schema)
    backend = getattr(block, "backend", None)
    if getattr(backend, "name", None) != "horovod" or comm.size() < 2:
        raise ValueError(
            f"--part distributed times the horovod backend on several ranks. "
            f"Received: --backend={args.backend}, ranks={comm.size()}"
        )
    n, me, r = comm.size(), comm.rank(), backend.routing
    feats = list(block.features)
    ordered, _ = ordered_inputs(x, feats)
    b = int(ordered[0][0].shape[0])
    out = {"step": _timed(_train_step(model), (x, y), args, "step")}

    ids_split = tf.constant([2 + b * sum(r.counts(j)) for j in range(n)], tf.int32)
    ids = tf.zeros([int(ids_split.numpy().sum())], tf.int64)
    widths = [r.width(j) for j in range(n)]
    fwd_split = tf.constant([b * widths[me]] * n, tf.int32)  # I send my rows to everyone
    bwd_split = tf.constant([b * w for w in widths], tf.int32)  # gradients go to the owners
    exchange = tf.function(lambda t, s, name: comm.alltoall(t, s, name=name)[0])
    dense = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables if not is_local(v)]
    merged_split = bwd_split + sum(t.shape.num_elements() for t in dense)
    sizes = {
        "ids_exchange": (ids, ids_split),
        "vectors_forward": (tf.zeros([int(fwd_split.numpy().sum())]), fwd_split),
    }
    if block.merge_backward:
        sizes["merged_backward"] = (tf.zeros([int(merged_split.numpy().sum())]), merged_split)
    else:
        sizes["vectors_backward"] = (tf.zeros([int(bwd_split.numpy().sum())]), bwd_split)
    for piece, (tensor, split) in sizes.items():
        out[piece] = _timed(
            lambda t, s, p=piece: exchange(t, s, f"mmde_breakdown_{p}"),
            (tensor, split),
            args,
            piece,
        )

    if not block.merge_backward:
        reduce_all = tf.function(
            lambda *grads: [
                comm.allreduce(g, name=f"mmde_breakdown_dense_{i}") for i, g in enumerate(grads)
            ]
        )
        out["dense_allreduce"] = _timed(reduce_all, dense, args, "dense")

    tables = backend.tables

    def validate(features):
        batch = tf.shape(features[feats[0].name], out_type=tf.int64)[0]
        count, deferred = local_problems(
            ordered_inputs(features, feats)[0], feats, tables, batch, check_ids=True
        )
        return count, tf.stack([ok for ok, _ in deferred])

    out["validation"] = _timed(tf.function(validate), (x,), args, "validation")
    # fit's input pipeline: the loader makes each batch beside the step (not inside it)
    out["loader"] = _timed(lambda: next(train), (), args, "loader")
    out["call_overhead"] = _timed(
        tf.function(lambda t: t + 1), (tf.constant(0.0),), args, "overhead"
    )
    bytes_ = {
        "ids_exchange": ids.shape[0] * 8,
        "vectors_forward": sizes["vectors_forward"][0].shape[0] * 4,
        "dense_gradients": sum(t.shape.num_elements() * t.dtype.size for t in dense),
    }
    return {"pieces": out, "bytes_sent_per_rank": bytes_, "dense_gradients": len(dense)}


def compute_pieces(args) -> dict:
    """``{"compute": [seconds per call]}``: the step with the block in one-process mode."""
    from merlin_models_de import comm
    from merlin_models_de.apps.common.optimizers import optimizer_for

    schema, _, x, y = _batch(args)
    args.validate_ids = False
    with comm.single_process():
        model, _ = _built(args, schema)
        # Merlin's compile wrapped the optimizer in Horovod's (it sees N ranks): unwrap
        model.optimizer = optimizer_for(args)
        step = _train_step(model)
        for _ in range(args.warmup):
            step(x, y)
    # every rank times at once, as they compute at once in the real step
    return {"pieces": {"compute": _timed(step, (x, y), args, "compute")}}


def summary(seconds: list[list[float]]) -> dict:
    """Per call the slowest rank; median, min and max over calls (seconds).

    Example:
        >>> summary([[1.0, 3.0, 2.0], [2.0, 1.0, 2.0]])
        {'median': 2.0, 'min': 2.0, 'max': 3.0, 'calls': 3}
    """
    slowest = [max(calls) for calls in zip(*seconds)]
    return {
        "median": statistics.median(slowest),
        "min": min(slowest),
        "max": max(slowest),
        "calls": len(slowest),
    }


def run(args) -> dict:
    """Times the pieces of ``args.part`` on every rank; returns the report (every rank)."""
    from merlin_models_de import comm
    from merlin_models_de.apps.common.cores import configure_threads

    threads = configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # noqa: F401  (Horovod is up: configure_threads or this)

    found = distributed_pieces(args) if args.part == "distributed" else compute_pieces(args)
    every = comm.allgather_object(found["pieces"], name="mmde_breakdown_gather")
    pieces = {name: summary([rank[name] for rank in every]) for name in every[0]}
    return {
        "part": args.part,
        "world_size": comm.size(),
        "cpu_threads": threads,
        "batch_size": args.batch_size,
        "optimizer": args.optimizer,
        "iterations": args.iterations,
        "pieces": pieces,
        **{k: v for k, v in found.items() if k != "pieces"},
    }


def combine(
    distributed: dict, compute: dict, fit_step: float | None = None, fit_median: float | None = None
) -> dict:
    """The step breakdown from the two parts' reports: each piece's median (minus the call
    overhead for pieces that run inside the step's one call), ``other_waiting`` (the step's
    measured time minus the pieces, at least 0) and ``gap`` (the same, signed: negative when
    pieces overlap in the step). ``fit_step`` / ``fit_median``: the mean and the median step
    of Keras fit in the runs, if known; then ``fit`` splits the fit step further.

    Example:
        >>> t = lambda s: {"median": s, "min": s, "max": s}
        >>> d = {"pieces": {"step": t(10.0), "call_overhead": t(0.5), **{p: t(1.5) for p in (
        ...     "ids_exchange", "vectors_forward", "merged_backward", "validation")}}}
        >>> combine(d, {"pieces": {"compute": t(3.0)}})["other_waiting"]
        3.0
    """
    med = lambda p: p["median"]  # noqa: E731
    d, over = distributed["pieces"], med(distributed["pieces"]["call_overhead"])
    parts = {"compute": med(compute["pieces"]["compute"])}
    parts.update({p: max(0.0, med(d[p]) - over) for p in EXCHANGES if p in d})
    step = med(d["step"])
    gap = step - sum(parts.values())
    fit = None
    if fit_step is not None and "loader" in d:  # the step as fit sees it
        loader, steady = med(d["loader"]), fit_median or fit_step
        fit = {
            "fit_step": fit_step,
            "fit_median": steady,
            "train_step": step,
            "loader": loader,
            "rest": steady - step - loader,
            "epoch_starts": fit_step - steady,
        }
    return {
        "step": step,
        "fit_step": fit_step,
        "parts": parts,
        "other_waiting": max(0.0, gap),
        "gap": gap,
        "call_overhead": over,
        "fit": fit,
        # min and max over calls, before the overhead is taken off
        "spread": {p: [v["min"], v["max"]] for p, v in {**d, **compute["pieces"]}.items()},
        "bytes_sent_per_rank": distributed.get("bytes_sent_per_rank"),
    }


LABELS = {
    "compute": "compute (fwd+bwd+update, no collective)",
    "ids_exchange": "id exchange (all-to-all)",
    "vectors_forward": "row exchange forward (all-to-all)",
    "vectors_backward": "row exchange backward (all-to-all)",
    "dense_allreduce": "dense gradient allreduce",
    "merged_backward": "rows backward and dense average (one all-to-all)",
    "validation": "id validation",
}


def markdown(title: str, b: dict) -> str:
    """One breakdown as a markdown table (ms per step and share of the step)."""
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    lines = [
        f"Step breakdown, {title}: step timed here {ms(b['step'])} ms"
        + (f" (in fit: {ms(b['fit_step'])} ms)" if b.get("fit_step") else ""),
        "",
        "| part | ms / step | share of step |",
        "| --- | --- | --- |",
    ]
    for name, seconds in b["parts"].items():
        lines.append(f"| {LABELS[name]} | {ms(seconds)} | {seconds / b['step']:.0%} |")
    lines.append(
        f"| other / waiting (step - parts) | {ms(b['other_waiting'])} | "
        f"{b['other_waiting'] / b['step']:.0%} |"
    )
    lines.append(
        f"| gap: step - sum of parts (signed; < 0: parts overlap) | {ms(b['gap'])} | "
        f"{b['gap'] / b['step']:.0%} |"
    )
    fit = b.get("fit")
    if fit:
        lines += [
            "",
            f"The step in fit: {ms(fit['fit_step'])} ms on average (the runs' median "
            f"warm samples/s), median step {ms(fit['fit_median'])} ms:",
            "",
            "| part | ms / step | share of fit step |",
            "| --- | --- | --- |",
        ]
        for label, key in (
            ("train_step (timed here, as above)", "train_step"),
            ("input (--input), next batch (measured; beside the step in fit)", "loader"),
            ("Keras loop, callbacks, rank skew (median fit step - train_step - loader)", "rest"),
            ("epoch starts and stalls (mean - median fit step)", "epoch_starts"),
        ):
            lines.append(f"| {label} | {ms(fit[key])} | {fit[key] / fit['fit_step']:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point; writes the report (``--report``) from rank 0."""
    from merlin_models_de import comm, launchers
    from merlin_models_de.apps.common.options import checked_arguments
    from merlin_models_de.apps.dlrm.options import check_host, check_options

    args = checked_arguments(_parser(), argv, check_options, check_host)
    if args is None:
        return 2
    for flag in ("iterations", "warmup"):
        least = 1 if flag == "iterations" else 0
        if getattr(args, flag) < least:  # the same on every rank: all exit together
            if launchers.launch_env()[1] == 0:
                print(
                    f"error: --{flag} must be >= {least}. Received: --{flag}="
                    f"{getattr(args, flag)}",
                    file=sys.stderr,
                )
            return 2
    report = run(args)
    if args.report and comm.rank() == 0:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    comm.barrier(name="mmde_breakdown_done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
