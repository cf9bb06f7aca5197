"""The epochs of a command under Horovod elastic (``--elastic`` of the DLRM and next-item
commands), the same for both.

Launch with ``horovodrun --gloo --min-np M --max-np N --host-discovery-script S``. Every
``--checkpoint-every`` steps the ranks commit a sharded checkpoint to ``--checkpoint-dir``
(shared storage on a cluster). When a host is lost (or added), the ranks there are now are
re-initialized, the model is rebuilt and re-planned for their number, the last commit is
restored into it and training goes on at the step after it. A step is one batch per rank
(``--batch-size`` rows each), so a step after a change of world size covers another number
of rows, and the epoch position is the commit's step counted in batches of the new size.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from merlin_models_de import comm
from merlin_models_de.apps.common.checkpoints import checkpoints_kept
from merlin_models_de.apps.common.epochs import (
    epoch_batches,
    equal_steps_for,
    rest_of_epoch,
    resume_point,
)
from merlin_models_de.apps.common.reports import write_report


def train_elastically(args, started: float, build: Callable, batches_for: Callable, **fit_options):
    """Trains ``args.epochs`` epochs of ``batches_for(size, rank)`` with the model ``build()``
    returns (compiled, for the ranks there are now); returns ``(state, report)``. Rank 0
    writes the report (``--report``, else ``report.json`` in the checkpoint directory)."""
    from merlin_models_de.elastic.state import ShardedState
    from merlin_models_de.elastic.state import run as elastic

    state = ShardedState(
        build, args.checkpoint_dir, commit_every=args.checkpoint_every, keep=checkpoints_kept(args)
    )
    starts = []

    @elastic
    def train(state):
        size, rank = comm.size(), comm.rank()
        batches = batches_for(size, rank)
        steps = equal_steps_for(batches, "train")
        epoch, done = resume_point(state.step, steps, args.epochs)
        starts.append({"step": state.step, "world_size": size, "at": time.perf_counter() - started})
        if rank == 0:
            print(
                f"elastic: {size} ranks from step {state.step} (epoch {epoch + 1}, "
                f"{done} of its {steps} batches done)",
                flush=True,
            )
        fit = dict(
            callbacks=[state.callback()], verbose=0 if (args.quiet or rank) else 2, **fit_options
        )
        if done:
            state.model.fit(
                rest_of_epoch(batches, done, steps),
                epochs=epoch + 1,
                initial_epoch=epoch,
                steps_per_epoch=steps - done,
                **fit,
            )
            epoch += 1
        if epoch < args.epochs:
            state.model.fit(
                epoch_batches(batches, steps),
                epochs=args.epochs,
                initial_epoch=epoch,
                steps_per_epoch=steps,
                **fit,
            )

    train(state)
    report = {
        "elastic": True,
        "world_size": comm.size(),
        "steps": state.step,
        "starts": starts,
        "commits": [{"step": s, "seconds": t} for s, t in state.commits],
        "seconds": time.perf_counter() - started,
    }
    return state, report


def write_elastic_report(args, report: dict) -> None:
    """Rank 0 says where the run ended and writes ``report`` (``--report``, else
    ``report.json`` in the checkpoint directory)."""
    if comm.rank() == 0:
        print(f"elastic: done, step {report['steps']} on {report['world_size']} ranks", flush=True)
    write_report(args.report or os.path.join(args.checkpoint_dir, "report.json"), report)
