"""A command's checkpoints in ``--checkpoint-dir``: the callback that saves them, and the resume
from the newest (restored, and where in its epoch training goes on)."""

from __future__ import annotations

from merlin_models_de import comm
from merlin_models_de.apps.common.epochs import resume_point

# A run that commits often fills its directory fast (whole Criteo with Adagrad: ~6 GiB a
# checkpoint); the newest few are what a resume or a look back needs.
DEFAULT_KEEP = 3


def checkpoints_kept(args) -> int | None:
    """How many checkpoints ``--checkpoint-keep`` keeps (None: every one)."""
    if args.checkpoint_keep is None:
        return DEFAULT_KEEP
    return args.checkpoint_keep or None


def checkpoint_callback(args):
    """The callback that saves ``--checkpoint-dir`` each epoch and every ``--checkpoint-every``
    steps (one for every fit: it remembers the step it saved last), or None without one."""
    if not args.checkpoint_dir:
        return None
    from merlin_models_de.persistence.checkpoint import CheckpointCallback

    return CheckpointCallback(
        args.checkpoint_dir, args.checkpoint_every, keep=checkpoints_kept(args)
    )


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
        more = (
            f"; epoch {epoch + 1} goes on after its first {done} of {steps} batches" if done else ""
        )
        print(f"Resumed from {path} (step {step}, epoch {epoch}{more})")
        if manifest.get("world_size", size) != size:
            # a step of another world size covers another number of rows: positions differ
            print(
                f"note: the checkpoint was written by {manifest['world_size']} ranks, this "
                f"run has {size}: its step {step} is taken as a step of this run "
                f"({args.batch_size * size} rows each), so some rows may be trained twice "
                f"or skipped"
            )
    return epoch, done, {"checkpoint": path, "step": step, "epoch": epoch, "skipped_batches": done}
