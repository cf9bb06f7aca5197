"""The DLRM run behind ``python -m merlin_models_de.apps.dlrm`` (imports TensorFlow and Merlin)."""

from __future__ import annotations

import os
import time

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.common.checkpoints import checkpoint_callback, restore_for
from merlin_models_de.apps.common.cores import configure_threads
from merlin_models_de.apps.common.epochs import epoch_batches, equal_steps_for, rest_of_epoch
from merlin_models_de.apps.common.optimizers import optimizer_for
from merlin_models_de.apps.common.reports import write_report
from merlin_models_de.apps.dlrm.model import datasets_for, metrics, model_for


def run(args, started: float, callbacks=()) -> dict:
    """Trains, evaluates, checkpoints and exports as ``args`` say; returns the report.

    Args:
        args: The parsed and checked options
            (:func:`~merlin_models_de.apps.dlrm.options.parser`).
        started: ``time.perf_counter()`` at process start (the report times phases from it).
        callbacks: Extra Keras callbacks, run after the report and the checkpoint ones.
    """
    threads = configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # noqa: F401  (Horovod is up: configure_threads or this)

    from merlin_models_de.apps.dlrm.report import EpochReport
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
    model.compile(
        optimizer=optimizer_for(args, emb),
        metrics=metrics(),
        steps_per_execution=args.steps_per_execution,
    )
    epoch, done, resumed = restore_for(args, model, steps, size)
    reporter = EpochReport(args, emb, steps, threads, started, phases, resumed=resumed)
    if rank == 0:
        print(reporter.placement())
    saver = checkpoint_callback(args)
    fit = dict(
        validation_data=valid,
        validation_steps=valid_steps,
        callbacks=[reporter] + ([saver] if saver else []) + list(callbacks),
        verbose=0,
    )  # the command prints one line per epoch itself
    if done:  # the interrupted epoch: only the batches it had not trained yet
        model.fit(
            rest_of_epoch(train, done, steps),
            epochs=epoch + 1,
            initial_epoch=epoch,
            steps_per_epoch=steps - done,
            **fit,
        )
        epoch += 1
    if epoch < args.epochs:
        model.fit(
            epoch_batches(train, steps),
            epochs=args.epochs,
            initial_epoch=epoch,
            steps_per_epoch=steps,
            **fit,
        )
    if args.export:
        model.save(args.export)
    report = reporter.finish()
    write_report(
        args.report
        or (os.path.join(args.checkpoint_dir, "report.json") if args.checkpoint_dir else None),
        report,
    )
    comm.barrier(name="mmde_dlrm_done")
    return report
