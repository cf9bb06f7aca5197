"""The DLRM run behind ``python -m merlin_models_de.dlrm`` (imports TensorFlow and Merlin)."""
from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from merlin_models_de import comm, compat
from merlin_models_de.apps.defaults import LEARNING_RATES


def configure_threads(cpu_threads: int | None) -> int:
    """TF threads per rank: the host's cores shared among its ranks (oversubscribed TF pools on
    a shared host cost more than the lost parallelism)."""
    threads = cpu_threads or max(1, (os.cpu_count() or 1) // comm.launch_env()[2])
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # TF already running in this process (run() called from Python)
        return tf.config.threading.get_intra_op_parallelism_threads()
    return threads


def _datasets(args, size, rank):
    """(schema, train loader, valid loader or None) for this rank."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    from merlin_models_de.apps.synthetic import capped_schema, rank_dataset
    from merlin_models_de.schemas import load_schema, synthetic_schema

    if args.train_dir:
        schema = load_schema(args.train_dir)

        def loader(path):
            ds = Dataset(path, engine="parquet", schema=schema)
            if ds.npartitions < size:
                ds = ds.repartition(npartitions=size)
            return mm.Loader(ds, batch_size=args.batch_size, shuffle=False, drop_last=True)

        return (schema, loader(args.train_dir),
                loader(args.valid_dir) if args.valid_dir else None)
    schema = capped_schema(synthetic_schema(args.dataset), args.max_table_rows)
    valid_rows = args.rows // 10 if args.valid_rows is None else args.valid_rows

    def local(rows, seed):
        ds = rank_dataset(schema, rows, args.batch_size, size, rank, seed)
        # The rows are this rank's already: no sharding by partition, no seed broadcast.
        return compat.take_local_rows(
            mm.Loader(ds, batch_size=args.batch_size, shuffle=False, drop_last=True))

    valid = local(valid_rows, args.seed + 1) if valid_rows >= args.batch_size * size else None
    return schema, local(args.rows, args.seed), valid


def _model(args, schema):
    import merlin.models.tf as mm
    from merlin.schema import Tags

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    if args.embeddings == "merlin":
        emb = mm.Embeddings(schema.select_by_tag(Tags.CATEGORICAL), dim=args.dim)
    else:
        emb = mm.DistributedEmbeddings(
            schema, dim=args.dim, strategy=args.strategy,
            column_slice_threshold=args.column_slice_threshold,
            row_slice_threshold=args.row_slice_threshold,
            data_parallel_threshold=args.data_parallel_threshold, backend=args.backend,
            validate_ids=args.validate_ids)
    label = schema.select_by_tag(Tags.BINARY_CLASSIFICATION).column_names
    if len(label) != 1:
        raise ValueError(f"The schema needs exactly one binary target column. Received: {label}")
    model = mm.DLRMModel(schema, embeddings=emb,
                         bottom_block=mm.MLPBlock(list(args.bottom_mlp) + [args.dim]),
                         top_block=mm.MLPBlock(list(args.top_mlp)),
                         prediction_tasks=mm.BinaryClassificationTask(label[0]))
    return model, emb


def _optimizer(args):
    legacy = tf.keras.optimizers.legacy
    lr = args.learning_rate or LEARNING_RATES[args.optimizer]
    return {"sgd": legacy.SGD, "adagrad": legacy.Adagrad, "adam": legacy.Adam}[args.optimizer](lr)


def _equal_steps(loader, name) -> int:
    """Steps per epoch every rank can take (ranks with more batches stop early, said aloud)."""
    counts = comm.allgather_object(len(loader), name=f"mmde_dlrm_steps_{name}")
    if min(counts) < 1:
        raise ValueError(f"A rank has no full {name} batch. Batches per rank: {counts}")
    if len(set(counts)) > 1 and comm.rank() == 0:
        print(f"note: {name} batches per rank differ {counts}; every rank takes {min(counts)}")
    return min(counts)


def run(args, started: float) -> dict:
    """Trains, evaluates, checkpoints and exports as ``args`` say; returns the report."""
    threads = configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # noqa: F401  (initializes Horovod under horovodrun)

    from merlin_models_de.checkpoint import (CheckpointCallback, latest_checkpoint,
                                             restore_checkpoint)
    from merlin_models_de.apps.dlrm_report import EpochReport
    from merlin_models_de.export import sample_batch

    phases = {"imports": time.perf_counter() - started}
    size, rank = comm.size(), comm.rank()
    schema, train, valid = _datasets(args, size, rank)
    phases["data"] = time.perf_counter() - started
    steps = _equal_steps(train, "train")
    valid_steps = _equal_steps(valid, "valid") if valid is not None else None
    model, emb = _model(args, schema)
    model(sample_batch(schema))
    phases["model_built"] = time.perf_counter() - started
    model.compile(optimizer=_optimizer(args),
                  metrics=[tf.keras.metrics.AUC(name="auc"),
                           tf.keras.metrics.BinaryCrossentropy(name="logloss")])
    initial_epoch = 0
    if args.checkpoint_dir and latest_checkpoint(args.checkpoint_dir):
        manifest = restore_checkpoint(model, args.checkpoint_dir)
        initial_epoch = min(args.epochs, manifest["step"] // steps)
        if rank == 0:
            print(f"Resumed from {latest_checkpoint(args.checkpoint_dir)} (step "
                  f"{manifest['step']}, epoch {initial_epoch})")
    reporter = EpochReport(args, emb, steps, threads, started, phases)
    if rank == 0:
        print(reporter.placement())
    callbacks = [reporter]
    if args.checkpoint_dir:
        callbacks.append(CheckpointCallback(args.checkpoint_dir, args.checkpoint_every))
    model.fit(train, epochs=args.epochs, initial_epoch=initial_epoch, steps_per_epoch=steps,
              validation_data=valid, validation_steps=valid_steps, callbacks=callbacks,
              verbose=0 if (args.quiet or rank != 0) else 2)
    if args.export:
        model.save(args.export)
    report = reporter.finish()
    path = args.report or (os.path.join(args.checkpoint_dir, "report.json")
                           if args.checkpoint_dir else None)
    if path and rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"Report: {path}")
    comm.barrier(name="mmde_dlrm_done")
    return report

