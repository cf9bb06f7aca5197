"""The epochs of a command's ``fit``: steps every rank can take, the batches of an epoch, the
rest of one a checkpoint interrupted (the DLRM and next-item commands, elastic or not)."""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm


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
