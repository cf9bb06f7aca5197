"""The DLRM run behind ``python -m merlin_models_de.apps.dlrm`` (imports TensorFlow and Merlin)."""
from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.compat import merlin as merlin_compat
from merlin_models_de.apps.cli import LOCAL_TABLES
from merlin_models_de.apps.cores import configure_threads
from merlin_models_de.apps.defaults import LEARNING_RATES


def datasets_for(args, size, rank):
    """(schema, train batches, valid batches or None) for this rank: a ``tf.data`` pipeline
    over the batches Merlin's ``Loader`` gives (``--input tf.data``, scalar columns), or the
    ``Loader`` itself."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    from merlin_models_de.apps.synthetic import capped_schema, rank_dataset
    from merlin_models_de.merlin.input import loader_dataset
    from merlin_models_de.schemas import load_schema, synthetic_schema

    def batches(ds, **local):
        if args.input == "tf.data" and not any(c.is_list for c in ds.schema):
            return loader_dataset(ds, args.batch_size, **local)
        loader = mm.Loader(ds, batch_size=args.batch_size, shuffle=False, drop_last=True)
        # local: the rows are this rank's already (no sharding by partition, no seed broadcast)
        return merlin_compat.take_local_rows(loader) if local else loader

    if args.train_dir:
        schema = load_schema(args.train_dir)

        def from_files(path):
            ds = Dataset(path, engine="parquet", schema=schema)
            if ds.npartitions < size:
                ds = ds.repartition(npartitions=size)
            return batches(ds)

        return (schema, from_files(args.train_dir),
                from_files(args.valid_dir) if args.valid_dir else None)
    schema = capped_schema(synthetic_schema(args.dataset), args.max_table_rows, args.table_scale)
    valid_rows = args.rows // 10 if args.valid_rows is None else args.valid_rows

    def local(rows, seed):
        ds = rank_dataset(schema, rows, args.batch_size, size, rank, seed)
        return batches(ds, rank=0, world_size=1)

    valid = local(valid_rows, args.seed + 1) if valid_rows >= args.batch_size * size else None
    return schema, local(args.rows, args.seed), valid


def model_for(args, schema):
    import merlin.models.tf as mm
    from merlin.schema import Tags

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    if args.embeddings in ("merlin", LOCAL_TABLES):
        emb = mm.Embeddings(schema.select_by_tag(Tags.CATEGORICAL), dim=args.dim)
    else:
        emb = mm.DistributedEmbeddings(
            schema, dim=args.dim, strategy=args.strategy,
            column_slice_threshold=args.column_slice_threshold,
            row_slice_threshold=args.row_slice_threshold,
            data_parallel_threshold=args.data_parallel_threshold, backend=args.backend,
            validate_ids=args.validate_ids, exchange_dtype=args.exchange_dtype,
            exchange_ahead=args.exchange_ahead, merge_backward=args.merge_backward)
    label = schema.select_by_tag(Tags.BINARY_CLASSIFICATION).column_names
    if len(label) != 1:
        raise ValueError(f"The schema needs exactly one binary target column. Received: {label}")
    model = mm.DLRMModel(schema, embeddings=emb,
                         bottom_block=mm.MLPBlock(list(args.bottom_mlp) + [args.dim]),
                         top_block=mm.MLPBlock(list(args.top_mlp)),
                         prediction_tasks=mm.BinaryClassificationTask(label[0]))
    return model, emb


def optimizer_for(args, emb=None):
    """The legacy Keras optimizer of ``--optimizer``. With ``--embeddings local-tables`` on
    several ranks, wrapped so that only the dense gradients are averaged (one grouped
    allreduce a step) and each rank trains its own copy of every table of ``emb``.

    That is not a valid training (the copies drift apart); it is the speed bound of an exact
    sharded step on the same host: half the samples' compute per rank, every table's lookups
    and updates for them, and the one dense average that any exact design needs, with no rows
    exchanged."""
    legacy = tf.keras.optimizers.legacy
    lr = args.learning_rate or LEARNING_RATES[args.optimizer]
    optimizer = {"sgd": legacy.SGD, "adagrad": legacy.Adagrad,
                 "adam": legacy.Adam}[args.optimizer](lr)
    if getattr(args, "embeddings", None) != LOCAL_TABLES or comm.size() == 1:
        return optimizer
    from merlin_models_de.compat.horovod import distributed_optimizer

    tables = {v.ref() for v in emb.trainable_variables}
    return distributed_optimizer(optimizer, is_local=lambda var: var.ref() in tables,
                                 prefix="mmde_bound")


def metrics() -> list:
    """The metrics the command compiles with (every training step updates them)."""
    return [tf.keras.metrics.AUC(name="auc"), tf.keras.metrics.BinaryCrossentropy(name="logloss")]


def batch_count(data) -> int:
    """Batches per epoch of a Merlin ``Loader`` or of a ``tf.data`` pipeline."""
    return int(data.cardinality()) if isinstance(data, tf.data.Dataset) else len(data)


def equal_steps_for(data, name) -> int:
    """Steps per epoch every rank can take (ranks with more batches stop early, said aloud)."""
    counts = comm.allgather_object(batch_count(data), name=f"mmde_dlrm_steps_{name}")
    if min(counts) < 1:
        raise ValueError(f"A rank has no full {name} batch. Batches per rank: {counts}")
    if len(set(counts)) > 1 and comm.rank() == 0:
        print(f"note: {name} batches per rank differ {counts}; every rank takes {min(counts)}")
    return min(counts)


class RestOfEpoch(tf.keras.utils.Sequence):
    """A Merlin loader's batches after its first ``skip``: the rest of a resumed epoch.

    Merlin's loader hands out its next batch whatever index Keras asks for, and starts over
    when its length is read (Keras reads it before every pass); this does the same and skips
    ``skip`` batches after each start, so Keras sees batches ``skip .. steps - 1``.
    """

    def __init__(self, loader, skip: int, steps: int):
        super().__init__()
        self.loader, self.skip, self.steps = loader, skip, steps
        self._start = True

    def __len__(self):
        self._start = True
        return self.steps - self.skip

    def __getitem__(self, index):
        if self._start:
            len(self.loader)  # Merlin's loader: back to its first batch
            for _ in range(self.skip):
                next(self.loader)
            self._start = False
        return next(self.loader)

    def on_epoch_end(self):
        self._start = True
        self.loader.on_epoch_end()


def epoch_batches(data, steps: int):
    """``data`` as ``fit`` takes it for ``steps`` steps an epoch: a ``tf.data`` pipeline cut to
    its first ``steps`` batches and repeated (``fit`` then reads one iterator for every epoch:
    the input reads the next epoch's first batches while this one ends and validates, instead
    of starting over, on each rank apart, at the next epoch's first step), a Merlin ``Loader``
    as it is."""
    return data.take(steps).repeat() if isinstance(data, tf.data.Dataset) else data


def rest_of_epoch(data, done: int, steps: int):
    """The batches of an epoch of ``steps`` after its first ``done``."""
    if isinstance(data, tf.data.Dataset):
        return data.take(steps).skip(done)
    return RestOfEpoch(data, done, steps)


def resume_point(step: int, steps: int, epochs: int) -> tuple[int, int]:
    """``(epoch, batches)``: the 0-based epoch a checkpoint at ``step`` resumes, and how many
    of its batches were trained already (0 at an epoch boundary or when training is done).

    Example:
        >>> resume_point(24, 16, 3)
        (1, 8)
    """
    epoch, done = divmod(step, steps)
    return (epochs, 0) if epoch >= epochs else (epoch, done)


def restore_for(args, model, steps, size):
    """Restores ``--checkpoint-dir`` if it holds a checkpoint; returns (epoch, batches done,
    what the report records)."""
    from merlin_models_de.persistence.checkpoint import latest_checkpoint, restore_checkpoint

    if not (args.checkpoint_dir and latest_checkpoint(args.checkpoint_dir)):
        return 0, 0, None
    path = latest_checkpoint(args.checkpoint_dir)
    manifest = restore_checkpoint(model, args.checkpoint_dir)
    step = manifest["step"]
    epoch, done = resume_point(step, steps, args.epochs)
    if comm.rank() == 0:
        more = (f"; epoch {epoch + 1} goes on after its first {done} of {steps} batches"
                if done else "")
        print(f"Resumed from {path} (step {step}, epoch {epoch}{more})")
        if manifest.get("world_size", size) != size:
            # a step of another world size covers another number of rows: positions differ
            print(f"note: the checkpoint was written by {manifest['world_size']} ranks, this "
                  f"run has {size}: its step {step} is taken as a step of this run "
                  f"({args.batch_size * size} rows each), so some rows may be trained twice "
                  f"or skipped")
    return epoch, done, {"checkpoint": path, "step": step, "epoch": epoch, "skipped_batches": done}


def run(args, started: float, callbacks=()) -> dict:
    """Trains, evaluates, checkpoints and exports as ``args`` say; returns the report.

    Args:
        args: The parsed and checked options (:func:`merlin_models_de.apps.dlrm.parser`).
        started: ``time.perf_counter()`` at process start (the report times phases from it).
        callbacks: Extra Keras callbacks, run after the report and the checkpoint ones.
    """
    threads = configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # noqa: F401  (Horovod is up: configure_threads or this)

    from merlin_models_de.persistence.checkpoint import CheckpointCallback
    from merlin_models_de.apps.dlrm_report import EpochReport
    from merlin_models_de.persistence.export import sample_batch

    phases = {"imports": time.perf_counter() - started}
    size, rank = comm.size(), comm.rank()
    schema, train, valid = datasets_for(args, size, rank)
    phases["data"] = time.perf_counter() - started
    steps = equal_steps_for(train, "train")
    valid_steps = equal_steps_for(valid, "valid") if valid is not None else None
    valid = epoch_batches(valid, valid_steps) if valid is not None else None
    # same initial weights for the same --seed (the broadcast then evens dense weights out;
    # the rank offset keeps one rank's shards from repeating another's values)
    tf.keras.utils.set_random_seed(args.seed + rank)
    model, emb = model_for(args, schema)
    model(sample_batch(schema))
    phases["model_built"] = time.perf_counter() - started
    model.compile(optimizer=optimizer_for(args, emb), metrics=metrics(),
                  steps_per_execution=args.steps_per_execution)
    epoch, done, resumed = restore_for(args, model, steps, size)
    reporter = EpochReport(args, emb, steps, threads, started, phases, resumed=resumed)
    if rank == 0:
        print(reporter.placement())
    ours = [reporter]
    if args.checkpoint_dir:
        keep = {} if args.checkpoint_keep is None else {"keep": args.checkpoint_keep}
        ours.append(CheckpointCallback(args.checkpoint_dir, args.checkpoint_every, **keep))
    fit = dict(validation_data=valid, validation_steps=valid_steps,
               callbacks=ours + list(callbacks),
               verbose=0)  # the command prints one line per epoch itself
    if done:  # the interrupted epoch: only the batches it had not trained yet
        model.fit(rest_of_epoch(train, done, steps), epochs=epoch + 1, initial_epoch=epoch,
                  steps_per_epoch=steps - done, **fit)
        epoch += 1
    if epoch < args.epochs:
        model.fit(epoch_batches(train, steps), epochs=args.epochs, initial_epoch=epoch,
                  steps_per_epoch=steps, **fit)
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

