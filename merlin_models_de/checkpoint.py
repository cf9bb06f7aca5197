"""Sharded checkpoints that restore into any world size or strategy.

Layout of ``directory``::

    latest                 name of the newest complete checkpoint (replaced atomically)
    ckpt-<step>/manifest.json   step, world size, every block's plan, slot names
    ckpt-<step>/dense.npz       dense weights and their optimizer slots (rank 0)
    ckpt-<step>/tables/<block>/<table>/<what>-r<rank>.npy   one saved shard per file

Every rank writes its own shards (and their optimizer slots) into a temporary directory;
after a barrier rank 0 renames it and then rewrites ``latest``: a crash mid-save leaves the
previous checkpoint untouched. Restoring reads, for each shard the new plan gives this rank,
only the overlapping rectangles of the saved shards through memory maps, in row chunks, so
no rank holds more than one chunk of a foreign shard at a time.

Example:
    >>> save_checkpoint(model, "ckpt/")  # every rank  # doctest: +SKIP
    >>> restore_checkpoint(model, "ckpt/")  # any world size, any strategy  # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
import shutil
import uuid

import numpy as np
import tensorflow as tf

from merlin_models_de import comm, compat
from merlin_models_de.planner.types import ShardingPlan
from merlin_models_de.variables import dense_weights, embedding_blocks, slot, slot_names

FORMAT = "merlin-models-de/1"
CHUNK_BYTES = 64 * 2**20


def _blocks_and_dense(model):
    blocks = embedding_blocks(model)
    return blocks, dense_weights(model, blocks)


def _shard_file(root, block, shard, what):
    return os.path.join(root, "tables", block, shard.table, f"{what}-r{shard.rank}.npy")


def save_checkpoint(model, directory: str, step: int | None = None) -> str:
    """Collective: writes this rank's shards, their slots and (rank 0) the rest.

    Returns the path of the new checkpoint.
    """
    blocks, dense = _blocks_and_dense(model)
    opt = getattr(model, "optimizer", None)
    step = int(step if step is not None else (opt.iterations.numpy() if opt is not None else 0))
    tmp = comm.broadcast_object(os.path.join(directory, f".tmp-{uuid.uuid4().hex}"),
                                name="mmde_ckpt_tmp")
    slots = slot_names(opt)
    for block in blocks:
        for shard in block.plan.stored_shards_on(block.rank):
            var, first = block.backend.shard_variable(shard)
            for what, source in [("table", var)] + [(s, slot(opt, var, s)) for s in slots]:
                if source is None:
                    continue
                path = _shard_file(tmp, block.name, shard, what)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                np.save(path, source[first:first + shard.rows].numpy())
    comm.barrier(name="mmde_ckpt_written")
    final = os.path.join(directory, f"ckpt-{step:09d}")
    if comm.rank() == 0:
        arrays = {f"w{i}": w.numpy() for i, w in enumerate(dense)}
        for i, w in enumerate(dense):
            for s in slots:
                state = slot(opt, w, s)
                if state is not None:
                    arrays[f"w{i}/{s}"] = state.numpy()
        np.savez(os.path.join(tmp, "dense.npz"), **arrays)
        manifest = {"format": FORMAT, "step": step, "world_size": comm.size(), "slots": slots,
                    "blocks": {b.name: b.plan.to_dict() for b in blocks}, "dense": len(dense)}
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_latest(directory, os.path.basename(final))
    comm.barrier(name="mmde_ckpt_done")
    return final


def _write_latest(directory, name):
    tmp = os.path.join(directory, f".latest-{uuid.uuid4().hex}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
    os.replace(tmp, os.path.join(directory, "latest"))


def latest_checkpoint(directory: str) -> str | None:
    """Path of the newest complete checkpoint in ``directory``, or None."""
    pointer = os.path.join(directory, "latest")
    if not os.path.isfile(pointer):
        return None
    with open(pointer, encoding="utf-8") as f:
        return os.path.join(directory, f.read().strip())


def _check(manifest, blocks):
    saved = {name: ShardingPlan.from_dict(p) for name, p in manifest["blocks"].items()}
    if sorted(saved) != sorted(b.name for b in blocks):
        raise ValueError(f"Checkpoint has embedding blocks {sorted(saved)} but the model has "
                         f"{sorted(b.name for b in blocks)}")
    for block in blocks:
        want = {t.name: (t.rows, t.dim) for t in saved[block.name].tables}
        have = {t.name: (t.rows, t.dim) for t in block.tables}
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                raise ValueError(
                    f"Checkpoint does not match the model in block '{block.name}', table "
                    f"'{name}': checkpoint (rows, dim)={want.get(name)}, model "
                    f"(rows, dim)={have.get(name)}")
    return saved


def _copy_overlaps(root, block_name, saved_plan, shard, what, target, first):
    """Fills ``target[first:first + shard.rows]`` from the saved shards that overlap it."""
    for old in saved_plan.stored_shards_of(shard.table):
        r0, r1 = max(shard.row_start, old.row_start), min(shard.row_start + shard.rows,
                                                          old.row_start + old.rows)
        c0, c1 = max(shard.col_start, old.col_start), min(shard.col_start + shard.cols,
                                                          old.col_start + old.cols)
        if r0 >= r1 or c0 >= c1:
            continue
        data = np.load(_shard_file(root, block_name, old, what), mmap_mode="r")
        step = max(1, CHUNK_BYTES // max(1, (c1 - c0) * data.dtype.itemsize))
        for lo in range(r0, r1, step):
            hi = min(r1, lo + step)
            chunk = np.array(data[lo - old.row_start:hi - old.row_start,
                                  c0 - old.col_start:c1 - old.col_start])
            target[first + lo - shard.row_start:first + hi - shard.row_start,
                   c0 - shard.col_start:c1 - shard.col_start].assign(chunk)


def restore_checkpoint(model, directory: str) -> dict:
    """Collective: restores the latest checkpoint of ``directory`` into ``model``.

    The model may run on another world size or strategy than the one that saved. Its
    optimizer (if compiled) gets its slots created and restored. Returns the manifest.
    """
    path = latest_checkpoint(directory)
    if path is None:
        raise FileNotFoundError(f"No complete checkpoint in directory. Received: {directory!r}")
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    blocks, dense = _blocks_and_dense(model)
    saved = _check(manifest, blocks)
    opt = getattr(model, "optimizer", None)
    compat.create_optimizer_slots(opt, model.trainable_variables)
    slots = [s for s in manifest["slots"] if s in slot_names(opt)]
    for block in blocks:
        for shard in block.plan.shards_on(block.rank):
            var, first = block.backend.shard_variable(shard)
            for what, target in [("table", var)] + [(s, slot(opt, var, s)) for s in slots]:
                if target is not None:
                    _copy_overlaps(path, block.name, saved[block.name], shard, what, target,
                                   first)
    arrays = np.load(os.path.join(path, "dense.npz"))
    if manifest["dense"] != len(dense):
        raise ValueError(f"Checkpoint has {manifest['dense']} dense weights, the model "
                         f"{len(dense)}")
    for i, w in enumerate(dense):
        w.assign(arrays[f"w{i}"])
        for s in slots:
            state = slot(opt, w, s)
            if state is not None and f"w{i}/{s}" in arrays:
                state.assign(arrays[f"w{i}/{s}"])
    if opt is not None:
        opt.iterations.assign(manifest["step"])
    comm.barrier(name="mmde_ckpt_restored")
    return manifest


class CheckpointCallback(tf.keras.callbacks.Callback):
    """Saves a sharded checkpoint every ``every_n_steps`` batches and/or each epoch.

    Example:
        >>> model.fit(loader, callbacks=[CheckpointCallback("ckpt/", every_n_steps=1000)])  # doctest: +SKIP
    """

    def __init__(self, directory: str, every_n_steps: int | None = None, each_epoch=True):
        super().__init__()
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1. Received: every_n_steps={every_n_steps!r}")
        self.directory, self.every_n_steps, self.each_epoch = directory, every_n_steps, each_epoch

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_n_steps:
            return
        step = int(self.model.optimizer.iterations.numpy())
        if self.every_n_steps and step % self.every_n_steps == 0:
            save_checkpoint(self.model, self.directory, step)

    def on_epoch_end(self, epoch, logs=None):
        if self.each_epoch:
            save_checkpoint(self.model, self.directory)


def read_full_tables(path: str) -> dict:
    """A checkpoint's tables and slots as full arrays: ``{block: {table: {what: array}}}``.

    Reads the files only (no TensorFlow model, no Horovod): for inspection and tests.
    """
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    out: dict = {}
    for block, plan_dict in manifest["blocks"].items():
        plan = ShardingPlan.from_dict(plan_dict)
        for table in plan.tables:
            for what in ["table"] + manifest["slots"]:
                full = None
                for s in plan.stored_shards_of(table.name):
                    file = _shard_file(path, block, s, what)
                    if not os.path.isfile(file):
                        continue
                    data = np.load(file)
                    if full is None:
                        full = np.zeros((table.rows, table.dim), data.dtype)
                    full[s.row_start:s.row_start + s.rows, s.col_start:s.col_start + s.cols] = data
                if full is not None:
                    out.setdefault(block, {}).setdefault(table.name, {})[what] = full
    return out
