"""Elastic training state for models with sharded tables (Horovod elastic, Gloo only).

Horovod's ``KerasState`` keeps a copy of the weights in memory and broadcasts rank 0's on a
reset: wrong for tables split across ranks, and a new world size needs shards of other
shapes. Here a commit is a sharded checkpoint (each rank writes its own shards), and a reset
rebuilds the model for the new world size (``build()`` re-plans the placement) and restores
the last commit into it: tables, optimizer slots and dense weights, and dynamic tables' key
maps, each key re-homed to its owner in the new world (``persistence/keymaps.py``). Training
goes on at the step after that commit.

Example (under ``horovodrun --gloo --min-np 1 --max-np 4 --host-discovery-script ...``):
    >>> state = ShardedState(build, "/shared/ckpt", commit_every=50)      # doctest: +SKIP
    >>> @run                                                               # doctest: +SKIP
    ... def train(state):
    ...     state.model.fit(batches_from(state.step), callbacks=[state.callback()])

A custom loop (``build`` sets ``model.optimizer``, whose slots the commits keep) calls
``state.after_step()`` after each optimizer step instead of passing the callback.
"""

from __future__ import annotations

import functools
import gc

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.memory import available_bytes
from merlin_models_de.compat import horovod as compat_horovod
from merlin_models_de.elastic.memory import reset_problem
from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.persistence.manifest import read_manifest
from merlin_models_de.runtime import agree


def run(func):
    """Decorates ``func(state, ...)``: on a lost rank (or a changed host set) the state is
    reset and ``func`` called again, on the ranks there are now."""
    return compat_horovod.elastic_run(func)


@functools.lru_cache(maxsize=None)
def _state_class():
    base = compat_horovod.elastic_object_state()

    class _ShardedState(base):
        __doc__ = ShardedState.__doc__

        def __init__(self, build, directory, commit_every, keep=None, **counters):
            if int(commit_every) < 1:
                raise ValueError(f"commit_every must be >= 1. Received: {commit_every}")
            self._build, self.directory = build, directory
            self.commit_every, self.keep, self.model = int(commit_every), keep, None
            self.commits = []  # (step, seconds) of the commits this process made
            super().__init__(
                bcast_object=comm.broadcast_object, get_rank=comm.rank, step=0, **counters
            )

        def save(self):  # commit: a sharded checkpoint named after the step
            start = tf.timestamp()
            save_checkpoint(self.model, self.directory, step=self.step, keep=self.keep)
            self.commits.append((self.step, float(tf.timestamp() - start)))
            super().save()

        def restore(self):  # a rank was lost: back to the counters of the last commit
            super().restore()
            _free(self)

        def reset(self):
            """Horovod runs on other ranks now: the model is rebuilt here, not in sync(),
            because Horovod skips sync() after a commit saw hosts removed (and nothing else)."""
            self._rebuild()

        def sync(self):
            if self.model is None:  # the first start, or a worker that has just joined
                self._rebuild()
            super().sync()  # counters from rank 0 (a new worker has none of its own)
            # the checkpoint is the truth: a rank lost after the checkpoint was complete
            # but before the commit returned leaves the counters one commit behind
            self.step = self._restored_step

        def _rebuild(self):
            """The model for the world size there is now, restored from the last commit."""
            if self.model is not None:
                _free(self)  # the old model's tables go before the new ones exist
            # rank 0's commit for every rank (a rank reading `latest` itself may see another
            # one); also the point where every rank has freed its old model
            _, seen = agree.on_every_rank(
                "elastic reset (resolve the commit)",
                lambda: latest_checkpoint(self.directory) if comm.rank() == 0 else None,
                share=lambda path: path,
                error_type=StorageError,
            )
            commit = seen[0]
            if commit is not None:
                _check_reset_fits(commit)
            self.model = self._build()
            if commit is None:  # first start: rank 0's dense weights for every rank
                save_checkpoint(self.model, self.directory, step=self.step, keep=self.keep)
            # a fresh model is thrown away if its restore fails: no need to read it all
            # before writing (that would hold a second copy of every shard)
            restored = restore_checkpoint(self.model, self.directory, all_or_nothing=False)
            self._restored_step = restored["step"]
            self.step = self._restored_step

        def after_step(self):
            """Counts a finished step and commits every ``commit_every`` steps (a custom
            loop calls it after each optimizer step; Keras ``fit`` takes :meth:`callback`)."""
            self.step += 1
            if self.step % self.commit_every == 0:
                self.commit()

        def callback(self):
            """Keras callback: :meth:`after_step` after every batch."""
            return _CommitEvery(self)

    return _ShardedState


def _free(state) -> None:
    """Drops ``state``'s model and what still holds it: Keras' global graph and names, and the
    reference cycles of its layers and traced functions, so its memory is back before the
    next model is built (a reset on one rank of whole Criteo otherwise holds both)."""
    state.model = None
    tf.keras.backend.clear_session()
    gc.collect()


def _check_reset_fits(commit: str) -> None:
    """Every rank raises MemoryError together when one rank of the world there is now could
    not hold its part of ``commit`` (see :mod:`merlin_models_de.elastic.memory`)."""

    def check():
        problem = reset_problem(
            read_manifest(commit),
            comm.size(),
            comm.rank(),
            comm.local_size(),
            available_bytes(),  # the host's, or less under a cgroup's limit
        )
        if problem:
            raise MemoryError(problem)

    agree.on_every_rank("elastic reset", check, error_type=MemoryError)


class ShardedState:
    """``ShardedState(build, directory, commit_every, keep=None, **counters)``.

    Args:
        build: Returns the compiled model for the current world size (called on every rank
            at the start and after each reset).
        directory: The checkpoint directory every rank sees (shared storage on a cluster).
        commit_every: Steps between commits (the steps a lost rank can cost).
        keep: Complete checkpoints to keep (None: all).
        counters: More values committed with the step and synced from rank 0 (epoch, ...).

    ``state.step`` is the number of steps done; ``state.commit()`` checkpoints and raises
    Horovod's ``HostsUpdatedInterrupt`` when hosts were added or removed;
    ``state.after_step()`` counts a step of a custom loop and commits on schedule;
    ``state.callback()`` does that for Keras ``fit``.
    """

    def __new__(cls, *args, **kwargs):
        return _state_class()(*args, **kwargs)


class _CommitEvery(tf.keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.after_step()
