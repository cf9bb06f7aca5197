"""``python -m merlin_models_de.apps.dlrm --elastic``: the DLRM run under Horovod elastic.

Launch with ``horovodrun --gloo --min-np M --max-np N --host-discovery-script S``. Every
``--checkpoint-every`` steps the ranks commit a sharded checkpoint to ``--checkpoint-dir``
(shared storage on a cluster). When a host is lost (or added), the ranks left are
re-initialized, the model is rebuilt and re-planned for their number, the last commit is
restored into it and training goes on at the step after it. A step is one batch per rank
(``--batch-size`` rows each), so a step after a change of world size covers another number
of rows, and the epoch position is the commit's step counted in batches of the new size.
"""
from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.dlrm_run import (configure_threads, datasets_for, epoch_batches,
                                            equal_steps_for, metrics, model_for, optimizer_for,
                                            rest_of_epoch, resume_point)


def _built(args):
    """The compiled model for the ranks there are now (tables re-planned for them)."""
    from merlin_models_de.persistence.export import sample_batch

    schema = datasets_for(args, comm.size(), comm.rank())[0]
    tf.keras.utils.set_random_seed(args.seed + comm.rank())
    model, _ = model_for(args, schema)
    model(sample_batch(schema))
    model.compile(optimizer=optimizer_for(args), metrics=metrics())
    return model


def run(args, started: float) -> dict:
    """Trains as ``args`` say, elastically; rank 0 writes and returns the report."""
    configure_threads(args.cpu_threads)
    import merlin.models.tf as mm  # noqa: F401  (initializes Horovod under horovodrun)

    from merlin_models_de.elastic.state import ShardedState
    from merlin_models_de.elastic.state import run as elastic

    state = ShardedState(lambda: _built(args), args.checkpoint_dir,
                         commit_every=args.checkpoint_every, keep=args.checkpoint_keep)
    starts = []

    @elastic
    def train(state):
        size, rank = comm.size(), comm.rank()
        _, batches, _ = datasets_for(args, size, rank)
        steps = equal_steps_for(batches, "train")
        epoch, done = resume_point(state.step, steps, args.epochs)
        starts.append({"step": state.step, "world_size": size, "at": time.perf_counter() - started})
        if rank == 0:
            print(f"elastic: {size} ranks from step {state.step} (epoch {epoch + 1}, "
                  f"{done} of its {steps} batches done)", flush=True)
        fit = dict(callbacks=[state.callback()], verbose=0 if (args.quiet or rank) else 2)
        if done:
            state.model.fit(rest_of_epoch(batches, done, steps), epochs=epoch + 1,
                            initial_epoch=epoch, steps_per_epoch=steps - done, **fit)
            epoch += 1
        if epoch < args.epochs:
            state.model.fit(epoch_batches(batches, steps), epochs=args.epochs,
                            initial_epoch=epoch,
                            steps_per_epoch=steps, **fit)

    train(state)
    report = {"elastic": True, "world_size": comm.size(), "steps": state.step, "starts": starts,
              "commits": [{"step": s, "seconds": t} for s, t in state.commits],
              "seconds": time.perf_counter() - started}
    path = args.report or os.path.join(args.checkpoint_dir, "report.json")
    if comm.rank() == 0:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"elastic: done, step {state.step} on {comm.size()} ranks. Report: {path}")
    return report
