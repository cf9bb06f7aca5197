"""Sharded checkpoints that restore into any world size or strategy.

Layout of ``directory`` (details in :mod:`merlin_models_de.persistence.files`)::

    latest                                name of the newest complete checkpoint
    ckpt-<step>[-<k>]/manifest.json       step, world size, every block's plan, which file
                                          holds which table / slot, optimizer state layout
    ckpt-<step>[-<k>]/dense.npz           dense weights, their slots, optimizer scalars (rank 0)
    ckpt-<step>[-<k>]/tables/<b>/<t>/<part>-r<rank>.npy   one saved shard per file

Saving: every rank writes its own shards (and their optimizer slots) into a temporary
directory; rank 0 then writes the dense weights and the manifest, renames the directory to a
name no checkpoint uses yet, and points ``latest`` at it. Only then are older copies of the
same step, checkpoints beyond ``keep`` and leftovers of interrupted saves removed: the
checkpoint ``latest`` names is always complete.

Restoring reads, for each shard the new plan gives this rank, only the overlapping
rectangles of the saved shards through memory maps, in row chunks, so no rank holds more
than one chunk of a foreign shard at a time. Every file is checked against the manifest and
the model before anything is written into the model.

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

import numpy as np
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.runtime import agree
from merlin_models_de.persistence.files import (DENSE, FORMAT, TMP_PREFIX, CheckpointError,
                                               check_array, dense_key, free_name, load_array,
                                               next_sequence, part_stem, prune, read_arrays,
                                               read_latest, read_manifest, read_full_tables,
                                               shard_file, state_key, write_array,
                                               write_arrays, write_latest, write_manifest)
from merlin_models_de.persistence.state import model_state, numpy_dtype

CHUNK_BYTES = 64 * 2**20

__all__ = ["CheckpointCallback", "CheckpointError", "latest_checkpoint", "read_full_tables",
           "restore_checkpoint", "save_checkpoint"]


# ---- every rank agrees ------------------------------------------------------------------------


def _stage(name: str, work, share=None):
    """One checkpoint stage that every rank agrees on (:func:`runtime.agree.on_every_rank`):
    a rank that failed re-raises its error, the others raise :class:`CheckpointError` naming
    it, so nobody waits in a collective that will never come."""
    return agree.on_every_rank(f"checkpoint {name}", work, share, error_type=CheckpointError)


# ---- save -------------------------------------------------------------------------------------


def _check_keep(keep) -> None:
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be None (keep every checkpoint) or an int >= 1. "
                         f"Received: keep={keep!r}")


def save_checkpoint(model, directory: str, step: int | None = None,
                    keep: int | None = None) -> str:
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
    prepared, shared = _stage("save (prepare)", lambda: _prepare(model, directory, step),
                              share=lambda p: (p.tmp, p.local_parts))
    state, step = prepared.state, prepared.step
    tmp = shared[0][0]
    try:
        parts = _merge_parts(state.blocks, [local for _, local in shared])
        _stage("save (write shards)", lambda: _write_shards(state, tmp, parts))
        _, done = _stage("save (commit)",
                         lambda: _commit(state, directory, tmp, step, parts, keep),
                         share=lambda final: final)
    except Exception:
        if comm.rank() == 0:  # every rank is past its writes (stages agree): the copy can go
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return done[0]


@dataclass
class _Prepared:
    state: object
    step: int
    tmp: str | None
    local_parts: dict = field(default_factory=dict)


def _prepare(model, directory, step) -> _Prepared:
    state = model_state(model)
    if step is None:
        step = int(state.optimizer.iterations.numpy()) if state.optimizer is not None else 0
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step must be an int >= 0. Received: step={step!r}")
    local = {}  # (block index, table name) -> [(part name, dtype)] of the shards stored here
    for b, block in enumerate(state.blocks):
        for shard in block.plan.stored_shards_on(block.rank):
            var, _ = block.backend.shard_variable(shard)
            local[(b, shard.table)] = [(n, numpy_dtype(v).name) for n, v in state.parts(var)]
    # rank 0 names the temporary directory; it is created by the first write into it
    tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}") if comm.rank() == 0 else None
    return _Prepared(state, int(step), tmp, local)


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
                    f"parts={[merged[key], parts]}")
    return merged


def _stems(parts, b, table_index, table) -> dict:
    """``{part name: file stem}`` of one table."""
    return {name: part_stem(b, table_index, k)
            for k, (name, _) in enumerate(parts.get((b, table), []))}


def _write_shards(state, tmp, parts) -> None:
    if comm.rank() == 0:
        os.makedirs(tmp, exist_ok=True)
    for b, block in enumerate(state.blocks):
        index = {t.name: i for i, t in enumerate(block.plan.tables)}
        for shard in block.plan.stored_shards_on(block.rank):
            var, first = block.backend.shard_variable(shard)
            stems = _stems(parts, b, index[shard.table], shard.table)
            for name, source in state.parts(var):
                path = shard_file(tmp, stems[name], shard.rank)
                write_array(path, source[first:first + shard.rows].numpy())


def _commit(state, directory, tmp, step, parts, keep) -> str | None:
    """Rank 0: dense weights, manifest, rename, ``latest``, then the clean-up."""
    if comm.rank() != 0:
        return None
    arrays, dense = {}, []
    for i, w in enumerate(state.dense):
        slots = sorted(state.slots(w).items())
        arrays[dense_key(i)] = w.numpy()
        arrays.update({dense_key(i, k): s.numpy() for k, (_, s) in enumerate(slots)})
        dense.append({"shape": list(w.shape), "dtype": numpy_dtype(w).name,
                      "slots": [_describe(n, s) for n, s in slots]})
    arrays.update({state_key(j): v.numpy() for j, v in enumerate(state.extra)})
    write_arrays(os.path.join(tmp, DENSE), arrays)
    write_manifest(tmp, {
        "format": FORMAT, "step": step, "sequence": next_sequence(directory),
        "world_size": comm.size(), "optimizer": state.label,
        "state": [_describe(v.name, v) for v in state.extra],
        "blocks": [_describe_block(b, block, parts) for b, block in enumerate(state.blocks)],
        "dense": dense})
    final = os.path.join(directory, free_name(directory, step))
    os.rename(tmp, final)  # a new name: the checkpoint `latest` names stays untouched
    write_latest(directory, os.path.basename(final))
    prune(directory, os.path.basename(final), keep)
    return final


def _describe(name, var) -> dict:
    return {"name": name, "shape": list(var.shape), "dtype": numpy_dtype(var).name}


def _describe_block(b, block, parts) -> dict:
    tables = []
    for t, table in enumerate(block.plan.tables):
        stems = _stems(parts, b, t, table.name)
        tables.append({"name": table.name, "parts": [
            {"name": name, "file": stems[name], "dtype": dtype}
            for name, dtype in parts.get((b, table.name), [])]})
    return {"name": block.name, "plan": block.plan.to_dict(), "tables": tables}


# ---- restore ----------------------------------------------------------------------------------


def latest_checkpoint(directory: str) -> str | None:
    """Path of the newest complete checkpoint in ``directory``, or None.

    Raises:
        CheckpointError: when ``latest`` names anything but a checkpoint inside ``directory``.
    """
    return read_latest(directory)


@dataclass
class _Restore:
    """Everything a restore writes, gathered (and checked) before anything is written."""

    manifest: object
    copies: list = field(default_factory=list)  # (file, saved shard, target, shard, first)
    assigns: list = field(default_factory=list)  # (variable, array)


def restore_checkpoint(model, directory: str) -> dict:
    """Collective: restores the latest checkpoint of ``directory`` into ``model``.

    The model may run on another world size or strategy than the one that saved. Its
    optimizer (if compiled) gets its slots created and restored with the rest of its state.
    Every file is checked (shapes, dtypes, sizes, paths) on every rank before anything is
    written into the model: a restore that fails a check leaves the model's weights as they
    were (only slots the optimizer lacked are created, as its first step would).

    Returns:
        The manifest (``step``, ``world_size``, ...).

    Raises:
        FileNotFoundError: when ``directory`` holds no complete checkpoint.
        CheckpointError: naming the file, when a file is missing, malformed or does not fit
            the model (a ``ValueError``).
    """
    plan, _ = _stage("restore (check)", lambda: _plan_restore(model, directory))
    _stage("restore (write)", lambda: _apply(plan))
    return plan.manifest.raw


def _plan_restore(model, directory) -> _Restore:
    path = latest_checkpoint(directory)
    if path is None:
        raise FileNotFoundError(f"No complete checkpoint in directory. Received: {directory!r}")
    manifest = read_manifest(path)
    state = model_state(model)
    saved = _match_blocks(manifest, state.blocks)
    # Optimizer state moves only when both sides have it: a model restored for inference
    # ignores it, and a checkpoint saved without it leaves the fresh optimizer as it is.
    with_optimizer = state.optimizer is not None and manifest.optimizer is not None
    plan = _Restore(manifest)
    for block in state.blocks:
        for shard in block.plan.shards_on(block.rank):
            _plan_shard(plan, path, saved[block.name], block, shard, state, with_optimizer)
    _plan_dense(plan, path, manifest, state, with_optimizer)
    if state.optimizer is not None and manifest.optimizer is None:
        plan.assigns.append((state.optimizer.iterations, np.asarray(manifest.step)))
    return plan


def _match_blocks(manifest, blocks) -> dict:
    """``{block name: SavedBlock}``; raises naming the first block or table that differs."""
    saved = {b.name: b for b in manifest.blocks}
    if sorted(saved) != sorted(b.name for b in blocks):
        raise CheckpointError(f"Checkpoint has embedding blocks {sorted(saved)} but the model "
                              f"has {sorted(b.name for b in blocks)}. Received: "
                              f"manifest={manifest.path}")
    for block in blocks:
        want = {t.name: (t.rows, t.dim) for t in saved[block.name].plan.tables}
        have = {t.name: (t.rows, t.dim) for t in block.tables}
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                raise CheckpointError(
                    f"Checkpoint does not match the model in block '{block.name}', table "
                    f"'{name}': checkpoint (rows, dim)={want.get(name)}, model "
                    f"(rows, dim)={have.get(name)}. Received: manifest={manifest.path}")
    return saved


def _plan_shard(plan, path, saved, block, shard, state, with_optimizer) -> None:
    """Adds the copies that fill this rank's ``shard`` (table and slots), files checked."""
    var, first = block.backend.shard_variable(shard)
    targets = dict(state.parts(var) if with_optimizer else [("table", var)])
    parts = {p.name: p for p in saved.parts[shard.table]}
    have = set(parts) if with_optimizer else {"table"}
    if set(targets) != have:
        raise CheckpointError(
            f"Checkpoint {path} holds {sorted(have)} for table '{shard.table}', the model "
            f"(optimizer {state.label}) needs {sorted(targets)}. Received: "
            f"checkpoint optimizer={plan.manifest.optimizer}")
    for name, target in targets.items():
        part = parts[name]
        if numpy_dtype(target) != part.dtype:
            raise CheckpointError(
                f"Checkpoint {path} holds table '{shard.table}' ({name}) as {part.dtype}, the "
                f"model as {numpy_dtype(target)}. Received: dtype={part.dtype}")
        for old in saved.plan.stored_shards_of(shard.table):
            if _overlap(shard, old) is not None:
                file = shard_file(path, part.stem, old.rank)
                check_array(file, (old.rows, old.cols), part.dtype)
                plan.copies.append((file, old, part.dtype, target, shard, first))


def _plan_dense(plan, path, manifest, state, with_optimizer) -> None:
    """Reads dense.npz (checked against the manifest) and pairs it with the model."""
    if len(manifest.dense) != len(state.dense):
        raise CheckpointError(f"Checkpoint has {len(manifest.dense)} dense weights, the model "
                              f"{len(state.dense)}. Received: manifest={manifest.path}")
    arrays = read_arrays(os.path.join(path, DENSE), manifest.dense_arrays())
    for i, (w, saved) in enumerate(zip(state.dense, manifest.dense)):
        _pair(plan, f"dense weight {i} ('{w.name}')", w, arrays[dense_key(i)], manifest)
        if not with_optimizer:
            continue
        slots = state.slots(w)
        names = [name for name, _, _ in saved.slots]
        if sorted(slots) != sorted(names):
            raise CheckpointError(
                f"Checkpoint {path} holds slots {sorted(names)} for dense weight {i} "
                f"('{w.name}'), the model's optimizer ({state.label}) has {sorted(slots)}. "
                f"Received: checkpoint optimizer={manifest.optimizer}")
        for k, name in enumerate(names):
            _pair(plan, f"slot '{name}' of dense weight {i}", slots[name],
                  arrays[dense_key(i, k)], manifest)
    if with_optimizer:
        _plan_optimizer_state(plan, manifest, state, arrays)


def _plan_optimizer_state(plan, manifest, state, arrays) -> None:
    saved = [(tuple(shape), np.dtype(dtype)) for _, shape, dtype in manifest.state]
    have = [(tuple(v.shape), numpy_dtype(v)) for v in state.extra]
    if saved != have:
        raise CheckpointError(
            f"The optimizer state in {manifest.path} ({manifest.optimizer}: "
            f"{[n for n, _, _ in manifest.state]}) does not fit the model's optimizer "
            f"({state.label}: {[v.name for v in state.extra]}). Received: "
            f"optimizer={manifest.optimizer}")
    for j, var in enumerate(state.extra):
        plan.assigns.append((var, arrays[state_key(j)]))


def _pair(plan, what, var, array, manifest) -> None:
    if tuple(var.shape) != array.shape or numpy_dtype(var) != array.dtype:
        raise CheckpointError(
            f"Checkpoint {manifest.path}: {what} is {array.dtype} {array.shape}, the model's "
            f"{numpy_dtype(var)} {tuple(var.shape)}. Received: shape={array.shape}")
    plan.assigns.append((var, array))


def _overlap(shard, old):
    """``(r0, r1, c0, c1)``, the rectangle both shards cover, or None."""
    r0 = max(shard.row_start, old.row_start)
    r1 = min(shard.row_start + shard.rows, old.row_start + old.rows)
    c0 = max(shard.col_start, old.col_start)
    c1 = min(shard.col_start + shard.cols, old.col_start + old.cols)
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None


def _apply(plan) -> None:
    for file, old, dtype, target, shard, first in plan.copies:
        _copy(load_array(file, (old.rows, old.cols), dtype), old, target, shard, first)
    for var, array in plan.assigns:
        var.assign(array)


def _copy(data, old, target, shard, first) -> None:
    """Fills ``target[first + rows of shard]`` from the saved shard ``old``, in row chunks."""
    r0, r1, c0, c1 = _overlap(shard, old)
    step = max(1, CHUNK_BYTES // max(1, (c1 - c0) * data.dtype.itemsize))
    for lo in range(r0, r1, step):
        hi = min(r1, lo + step)
        chunk = np.array(data[lo - old.row_start:hi - old.row_start,
                              c0 - old.col_start:c1 - old.col_start])
        target[first + lo - shard.row_start:first + hi - shard.row_start,
               c0 - shard.col_start:c1 - shard.col_start].assign(chunk)


# ---- callback ---------------------------------------------------------------------------------


class CheckpointCallback(tf.keras.callbacks.Callback):
    """Saves a sharded checkpoint every ``every_n_steps`` batches and/or each epoch.

    A step is saved once: an epoch that ends on a multiple of ``every_n_steps`` is not saved
    again. ``keep`` is passed to :func:`save_checkpoint`.

    Example:
        >>> callback = CheckpointCallback("ckpt/", every_n_steps=1000, keep=3)  # doctest: +SKIP
        >>> model.fit(loader, callbacks=[callback])  # doctest: +SKIP
    """

    def __init__(self, directory: str, every_n_steps: int | None = None, each_epoch=True,
                 keep: int | None = None):
        super().__init__()
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1. "
                             f"Received: every_n_steps={every_n_steps!r}")
        _check_keep(keep)
        self.directory, self.every_n_steps, self.each_epoch = directory, every_n_steps, each_epoch
        self.keep = keep
        self._saved_step = None

    def _save(self, step: int) -> None:
        if step != self._saved_step:
            save_checkpoint(self.model, self.directory, step, keep=self.keep)
            self._saved_step = step

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_n_steps:
            return
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every_n_steps == 0:
            self._save(step)

    def on_epoch_end(self, epoch, logs=None):
        if self.each_epoch:
            self._save(int(self.model.optimizer.iterations.numpy()))
