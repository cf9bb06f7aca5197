"""Sharded checkpoints that restore into any world size or strategy.

Layout of ``directory`` (details in :mod:`merlin_models_de.persistence.layout`)::

    latest                                name of the newest complete checkpoint
    ckpt-<step>[-<k>]/manifest.json       step, world size, every block's plan, which file
                                          holds which table / slot, optimizer state layout
    ckpt-<step>[-<k>]/dense.npz           dense weights, their slots, optimizer scalars (rank 0)
    ckpt-<step>[-<k>]/tables/<b>/<t>/<part>-r<rank>.npy   one saved shard per file

Saving: the ranks check the free space first; rank 0 takes the directory's lock
(:mod:`~merlin_models_de.persistence.lock`: one writing job at a time, a second one is refused
naming the first). Every rank writes its own shards (and their optimizer slots) into a
temporary directory, each file and its directory entries flushed to disk; rank 0 then writes
the dense weights and the manifest (flushed too), checks that every file the manifest lists is
there with its size, renames the directory to a name no checkpoint uses yet, flushes that
rename, and points ``latest`` at it. Only then are older copies of the same step,
checkpoints beyond ``keep`` and the temporaries that earlier writers left before the lock was
taken removed (never a temporary that appeared since): the checkpoint ``latest`` names is
always complete.

Restoring (:mod:`~merlin_models_de.persistence.restore`): every rank restores the checkpoint
rank 0 resolves, checked and read in full on every rank before anything is written into
any model.

Under horovodrun every step that can fail ends with an exchange of each rank's outcome: when
one rank fails, every rank raises (the others naming that rank) instead of waiting forever.

Example:
    >>> save_checkpoint(model, "ckpt/", keep=3)  # every rank  # doctest: +SKIP
    >>> restore_checkpoint(model, "ckpt/")  # any world size, any strategy  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.persistence import keymaps
from merlin_models_de.persistence.disk import check_free_space, npy_bytes
from merlin_models_de.persistence.io import (
    StorageError,
    fsync_directories,
    fsync_directory,
    to_disk,
    write_array,
    write_arrays,
)
from merlin_models_de.persistence.layout import (
    DENSE,
    TMP_PREFIX,
    free_name,
    leftovers,
    part_stem,
    pointer_problem,
    shard_file,
    write_latest,
)
from merlin_models_de.persistence.lock import CheckpointLockedError, DirectoryLock
from merlin_models_de.persistence.manifest import (
    FORMAT,
    check_complete,
    dense_key,
    part_shape,
    read_full_tables,
    state_key,
    write_manifest,
)
from merlin_models_de.persistence.restore import latest_checkpoint, restore_checkpoint
from merlin_models_de.persistence.retention import next_sequence, prune
from merlin_models_de.persistence.state import dtype_name, model_state, numpy_dtype
from merlin_models_de.runtime import agree

__all__ = [
    "CheckpointCallback",
    "latest_checkpoint",
    "read_full_tables",
    "restore_checkpoint",
    "save_checkpoint",
]


# ---- every rank agrees ------------------------------------------------------------------------


def _stage(name: str, work, share=None):
    """One checkpoint stage that every rank agrees on (:func:`runtime.agree.on_every_rank`):
    a rank that failed re-raises its error, the others raise :class:`StorageError` naming
    it, so nobody waits in a collective that will never come."""
    return agree.on_every_rank(f"checkpoint {name}", work, share, error_type=StorageError)


# ---- save -------------------------------------------------------------------------------------


def _check_keep(keep) -> None:
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(
            f"keep must be None (keep every checkpoint) or an int >= 1. Received: keep={keep!r}"
        )


def save_checkpoint(model, directory: str, step: int | None = None, keep: int | None = None) -> str:
    """Collective: writes this rank's shards, their slots and (rank 0) the rest.

    Args:
        model: The model (or a bare ``DistributedEmbeddings`` block).
        directory: The checkpoint directory (created if missing), shared by all ranks.
        step: The step the checkpoint is named after; the optimizer's iterations by default.
        keep: Keep only the ``keep`` most recently saved complete checkpoints (the new one
            included); None keeps all.

    Returns:
        The path of the new checkpoint.

    Raises:
        NotImplementedError: naming the optimizer, when its state cannot be saved in full.
    """
    _check_keep(keep)
    prepared, shared = _stage(
        "save (prepare)",
        lambda: _prepare(model, directory, step),
        share=lambda p: (p.tmp, p.local_parts, p.local_bytes),
    )
    state, step = prepared.state, prepared.step
    tmp = shared[0][0]
    lock = DirectoryLock(directory) if comm.rank() == 0 else None
    total = sum(size for _, _, size in shared)
    held = None  # rank 0's lock once taken
    try:
        stale, _ = _stage(
            "save (claim the directory)",
            lambda: _claim(lock, directory, total, prepared.local_bytes),
        )
        held = lock
        parts = _merge_parts(state.blocks, [local for _, local, _ in shared])
        _stage("save (write shards)", lambda: _holding(lock, _write_shards, state, tmp, parts))
        _, done = _stage(
            "save (commit)",
            lambda: _holding(lock, _commit, state, directory, tmp, step, parts, keep, stale, lock),
            share=lambda final: final,
        )
    except Exception as exc:
        if comm.rank() == 0:  # every rank is past its writes (stages agree): the copy can go
            shutil.rmtree(tmp, ignore_errors=True)
            _if_lock_lost(held, exc)  # another rank's write failed: was the lock lost?
        raise
    finally:
        if lock is not None:
            lock.release()
    return done[0]


def _claim(lock, directory, total, local_bytes):
    """Checks the free space (rank 0: for the whole checkpoint, as ranks usually share the
    file system; the others: for their own files); rank 0 then takes the directory's lock
    and returns the temporaries left by earlier writers (theirs to remove)."""
    if lock is None:
        check_free_space(directory, local_bytes, "this rank's shards of the new checkpoint")
        return None
    check_free_space(
        directory, total, "the new checkpoint (the old ones stay until it is complete)"
    )
    problem = pointer_problem(directory, "Remove it; the checkpoints beside it stay.")
    if problem:  # refused before anything is written, not after the rename
        raise StorageError(problem)
    lock.acquire()
    return leftovers(directory)


def _if_lock_lost(lock, exc) -> None:
    """Raises :class:`CheckpointLockedError` (from ``exc``) when another job took ``lock``
    over: the taker removed this save's files, which is why ``exc`` happened."""
    problem = lock.lost() if lock is not None else None
    if problem:
        raise CheckpointLockedError(problem) from exc


def _holding(lock, work, *args):
    """``work(*args)``; on rank 0 (which holds ``lock``) a failure after the lock was taken
    over is reported as that."""
    try:
        return work(*args)
    except Exception as exc:
        _if_lock_lost(lock, exc)
        raise


@dataclass
class _Prepared:
    state: object
    step: int
    tmp: str | None
    local_parts: dict = field(default_factory=dict)
    local_bytes: int = 0  # what this rank will write


def _prepare(model, directory, step) -> _Prepared:
    state = model_state(model)
    if step is None:
        step = int(state.optimizer.iterations.numpy()) if state.optimizer is not None else 0
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step must be an int >= 0. Received: step={step!r}")
    local, size = {}, 0  # (block index, table) -> [(part name, dtype, per row)] of the shards here
    for b, block in enumerate(state.blocks):
        for shard in block.plan.stored_shards_on(block.rank):
            var, _ = block.backend.shard_variable(shard)
            per_row = state.per_row(var)
            local[(b, shard.table)] = [(n, dtype_name(v), per_row[n]) for n, v in state.parts(var)]
            size += sum(
                npy_bytes(part_shape(shard, per_row[n]), numpy_dtype(v).itemsize)
                for n, v in state.parts(var)
            )
            if keymaps.keymap_of(block, shard.table) is not None:
                size += keymaps.map_bytes(shard, block.plan.table(shard.table).dynamic)
    # rank 0 names the temporary directory; it is created by the first write into it
    tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}") if comm.rank() == 0 else None
    if comm.rank() == 0:
        size += sum(
            npy_bytes(v.shape, numpy_dtype(v).itemsize)
            for w in state.dense
            for v in [w, *state.slots(w).values()]
        ) + 8192 * (1 + len(state.extra))
    return _Prepared(state, int(step), tmp, local, size)


def _merge_parts(blocks, per_rank) -> dict:
    """``{(block index, table): [(part, dtype)]}`` over all ranks; a table whose shards have
    different slots on different ranks cannot be described by one manifest entry."""
    merged: dict = {}
    for local in per_rank:
        for key, parts in local.items():
            if merged.setdefault(key, parts) != parts:
                raise ValueError(
                    f"The shards of table '{key[1]}' in block '{blocks[key[0]].name}' have "
                    f"different optimizer slots on different ranks. Received: "
                    f"parts={[merged[key], parts]}"
                )
    return merged


def _stems(parts, b, table_index, table) -> dict:
    """``{part name: file stem}`` of one table."""
    return {
        name: part_stem(b, table_index, k) for k, (name, *_) in enumerate(parts.get((b, table), []))
    }


def _write_shards(state, tmp, parts) -> None:
    """This rank's shards and their slots, each file and the directory entries naming it
    flushed to disk (rank 0 moves ``latest`` only after every rank is past this)."""
    if comm.rank() == 0:
        os.makedirs(tmp, exist_ok=True)
    written = []
    for b, block in enumerate(state.blocks):
        index = {t.name: i for i, t in enumerate(block.plan.tables)}
        for shard in block.plan.stored_shards_on(block.rank):
            var, first = block.backend.shard_variable(shard)
            stems = _stems(parts, b, index[shard.table], shard.table)
            for name, source in state.parts(var):
                path = shard_file(tmp, stems[name], shard.rank)
                # sliced as a value, not as a variable: a variable's slice carries an
                # `assign` that holds the variable for as long as the slice lives
                write_array(path, to_disk(source.value()[first : first + shard.rows].numpy()))
                written.append(path)
            keymap = keymaps.keymap_of(block, shard.table)
            if keymap is not None:
                option = block.plan.table(shard.table).dynamic
                stems = keymaps.map_stems(b, index[shard.table], option)
                written += keymaps.write_map(tmp, stems, shard.rank, keymap)
    fsync_directories(tmp, written)


def _commit(state, directory, tmp, step, parts, keep, stale, lock) -> str | None:
    """Rank 0: dense weights, manifest, the check that every file it lists is there whole,
    rename, ``latest``, then the clean-up (of what ``stale`` lists, never another writer's
    temporaries) -- only while it still holds ``lock``."""
    if comm.rank() != 0:
        return None
    lock.check_held()
    arrays, dense = {}, []
    for i, w in enumerate(state.dense):
        slots = sorted(state.slots(w).items())
        arrays[dense_key(i)] = w.numpy()
        arrays.update({dense_key(i, k): s.numpy() for k, (_, s) in enumerate(slots)})
        dense.append(
            {
                "shape": list(w.shape),
                "dtype": numpy_dtype(w).name,
                "slots": [_describe(n, s) for n, s in slots],
            }
        )
    arrays.update({state_key(j): v.numpy() for j, v in enumerate(state.extra)})
    write_arrays(os.path.join(tmp, DENSE), arrays)
    write_manifest(
        tmp,
        {
            "format": FORMAT,
            "id": uuid.uuid4().hex,
            "step": step,
            "sequence": next_sequence(directory),
            "world_size": comm.size(),
            "optimizer": state.label,
            "state": [_describe(v.name, v) for v in state.extra],
            "blocks": [_describe_block(b, block, parts) for b, block in enumerate(state.blocks)],
            "dense": dense,
        },
    )
    check_complete(tmp)
    fsync_directory(tmp)  # dense.npz's entry (the manifest's is flushed with it)
    lock.check_held()  # the last moment before the directory changes
    final = os.path.join(directory, free_name(directory, step))
    os.rename(tmp, final)  # a new name: the checkpoint `latest` names stays untouched
    fsync_directory(directory)  # the rename on disk before `latest` may name it
    write_latest(directory, os.path.basename(final))
    prune(directory, os.path.basename(final), keep, stale)
    return final


def _describe(name, var) -> dict:
    return {"name": name, "shape": list(var.shape), "dtype": dtype_name(var)}


def _describe_block(b, block, parts) -> dict:
    tables = []
    for t, table in enumerate(block.plan.tables):
        stems = _stems(parts, b, t, table.name)
        entry = {
            "name": table.name,
            "parts": [
                {"name": name, "file": stems[name], "dtype": dtype}
                | ({"per_row": True} if per_row else {})
                for name, dtype, per_row in parts.get((b, table.name), [])
            ],
        }
        if table.dynamic is not None:  # its key map, beside each rank's shard
            entry["map"] = keymaps.map_stems(b, t, table.dynamic)
        tables.append(entry)
    return {"name": block.name, "plan": block.plan.to_dict(), "tables": tables}


# ---- callback ---------------------------------------------------------------------------------


class CheckpointCallback(tf.keras.callbacks.Callback):
    """Saves a sharded checkpoint every ``every_n_steps`` batches and/or each epoch.

    With ``steps_per_execution`` above 1, Keras ends a batch only every so many steps: the
    checkpoint for each multiple of ``every_n_steps`` is then saved at the first batch end at
    or after it (every_n_steps=6, steps_per_execution=4: at steps 8, 12, 20, 24), one save
    for several multiples passed in one call. A step is saved once: an epoch that ends on a
    saved step is not saved again. ``keep`` is passed to :func:`save_checkpoint`.

    Example:
        >>> callback = CheckpointCallback("ckpt/", every_n_steps=1000, keep=3)  # doctest: +SKIP
        >>> model.fit(loader, callbacks=[callback])  # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str,
        every_n_steps: int | None = None,
        each_epoch=True,
        keep: int | None = None,
    ):
        super().__init__()
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(
                f"every_n_steps must be >= 1. Received: every_n_steps={every_n_steps!r}"
            )
        _check_keep(keep)
        self.directory, self.every_n_steps, self.each_epoch = directory, every_n_steps, each_epoch
        self.keep = keep
        self._saved_step: int | None = None
        self._multiple = None  # the last multiple of every_n_steps saved (or passed at start)

    def _save(self, step: int) -> None:
        if step != self._saved_step:
            save_checkpoint(self.model, self.directory, step, keep=self.keep)
            self._saved_step = step

    def on_train_begin(self, logs=None):
        if self.every_n_steps:  # a resumed run saves at the next multiple, not at once
            self._multiple = int(self.model.optimizer.iterations.numpy()) // self.every_n_steps

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_n_steps:
            return
        step = int(self.model.optimizer.iterations.numpy())
        if self._multiple is None:
            self._multiple = (step - 1) // self.every_n_steps
        if step // self.every_n_steps > self._multiple:
            self._save(step)
            self._multiple = step // self.every_n_steps

    def on_epoch_end(self, epoch, logs=None):
        if self.each_epoch:
            self._save(int(self.model.optimizer.iterations.numpy()))
