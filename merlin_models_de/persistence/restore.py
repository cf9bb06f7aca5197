"""Restoring a sharded checkpoint: every rank the same one, and all of it or nothing.

1. *Resolve*: rank 0 reads ``latest`` and every rank opens that checkpoint (a rank that read
   ``latest`` itself could see another one: a concurrent writer moved it, or a shared file
   system served a stale copy).
2. *Check*: every rank reads the manifest and checks each file it needs against the manifest
   and the model; the ranks compare the manifest's id, step, save number and world size, and
   all stop when they differ.
3. *Read*: every rank reads the rectangles of the saved shards that overlap its new shards
   (through memory maps, in row chunks) into arrays shaped like its shards.
4. *Write*: only when every rank has read every piece are the model's variables assigned.

A dynamic table's keys go to the ranks that own them now, with their rows and optimizer
state (:mod:`.keymaps`); step 2 decides where each goes, from the saved key maps.

A failure in steps 1-3 on any rank -- a bad file, an I/O error on the fifth shard -- raises
on every rank and leaves every rank's model as it was. The price: while restoring, a rank
holds its own shards a second time. A fresh model that is thrown away when its restore fails
(an elastic reset) takes ``all_or_nothing=False``: steps 3 and 4 run a shard at a time, so a
rank holds one shard's copy, and a failure leaves the model part-written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from merlin_models_de import comm
from merlin_models_de.persistence import keymaps
from merlin_models_de.persistence.io import (
    StorageError,
    check_array,
    from_disk,
    inside,
    load_array,
    read_arrays,
)
from merlin_models_de.persistence.layout import (
    DENSE,
    LATEST,
    MANIFEST,
    pointer_problem,
    read_latest,
    shard_file,
)
from merlin_models_de.persistence.manifest import dense_key, read_manifest, state_key
from merlin_models_de.persistence.retention import complete_checkpoints
from merlin_models_de.persistence.state import dtype_name, model_state, numpy_dtype
from merlin_models_de.runtime import agree

CHUNK_BYTES = 64 * 2**20


def _stage(name: str, work, share=None):
    return agree.on_every_rank(f"checkpoint {name}", work, share, error_type=StorageError)


def latest_checkpoint(directory: str) -> str | None:
    """Path of the newest complete checkpoint in ``directory``, or None.

    Raises:
        StorageError: when ``latest`` names anything but a checkpoint inside ``directory``,
            or a checkpoint that is gone (the message names the intact one to restore).
    """
    pointer = os.path.join(directory, LATEST)
    if pointer_problem(directory):
        raise StorageError(pointer_problem(directory, _intact(directory, pointer, remove=True)))
    for _ in range(2):  # read again once: a save may have moved `latest` on meanwhile
        path = read_latest(directory)
        if path is None or os.path.isfile(os.path.join(path, MANIFEST)):
            return path
    raise StorageError(_gone(directory, str(path)))


def _gone(directory: str, path: str) -> str:
    """Why the checkpoint ``latest`` names cannot be restored, and what can be."""
    pointer = os.path.join(directory, LATEST)
    what = (
        f"the directory {path} is missing (deleted?)"
        if not os.path.isdir(path)
        else f"{path} has no {MANIFEST} (partly deleted?)"
    )
    return (
        f"The checkpoint pointer {pointer} names {os.path.basename(path)}, but {what}. "
        f"{_intact(directory, pointer)} Received: latest={os.path.basename(path)!r}"
    )


def _intact(directory: str, pointer: str, remove: bool = False) -> str:
    """Which intact checkpoint is left, and how to restore it (``remove``: what is at
    ``pointer`` has to go first)."""
    intact = complete_checkpoints(directory)  # oldest save first
    if not intact:
        return (
            f"No intact checkpoint is left in {directory}: remove {pointer} to start from scratch."
        )
    newest = intact[-1]
    point = f"echo {newest.name} > {pointer}"
    return (
        f"The newest intact checkpoint is {os.path.join(directory, newest.name)} "
        f"(step {newest.step}): to restore it, point latest at it "
        f"(`{f'rm -r {pointer} && {point}' if remove else point}`) and restore again."
    )


@dataclass
class _Restore:
    """Everything a restore writes, gathered (and checked) before anything is written."""

    manifest: object
    copies: list = field(default_factory=list)  # (file, saved shard, Part, target, shard, first)
    assigns: list = field(default_factory=list)  # (variable, array)
    # id(target) -> [(file, shape, dtype, its rows, the target's rows)]: dynamic tables' rows
    # whose key moved to another slot (after the copies by row)
    moves: dict = field(default_factory=dict)
    maps: list = field(default_factory=list)  # keymaps.Rehomed, loaded after the writes


def restore_checkpoint(model, directory: str, *, all_or_nothing: bool = True) -> dict:
    """Collective: restores the latest checkpoint of ``directory`` into ``model``.

    The model may run on another world size or strategy than the one that saved. Its
    optimizer (if compiled) gets its slots created and restored with the rest of its state.
    Every rank restores the checkpoint rank 0 finds, and every file is checked on every rank
    before anything is written.

    Args:
        all_or_nothing: True: nothing is written into any rank's model before every rank has
            read all it needs (see the module doc), so a restore that fails leaves the
            model's weights as they were (only slots the optimizer lacked are created, as
            its first step would); a rank holds a second copy of its shards meanwhile.
            False: each shard is written as soon as it is read (one shard's copy at a time),
            for a fresh model that is thrown away if the restore fails (an elastic reset).

    Returns:
        The manifest (``step``, ``world_size``, ...); with dynamic tables, also
        ``"rehomed"``: per rank ``{(block, table): {"keys", "evicted", "candidates",
        "forgotten"}}`` (the keys it owns now, those evicted for want of rows, and the same
        for candidates). Where a rank evicted, rank 0 prints one line per table saying so.

    Raises:
        FileNotFoundError: when ``directory`` holds no complete checkpoint.
        StorageError: naming the file, when a file is missing, malformed, unreadable or
            does not fit the model (a ``ValueError``); naming the ranks, when they see
            different checkpoints.
    """
    _, names = _stage(
        "restore (resolve)",
        lambda: _resolve(directory),
        share=lambda path: None if path is None else os.path.basename(path),
    )
    if names[0] is None:
        raise FileNotFoundError(f"No complete checkpoint in directory. Received: {directory!r}")
    plan, seen = _stage(
        "restore (check)",
        lambda: _plan_restore(model, directory, names[0]),
        share=lambda p: (_identity(p.manifest), {(m.block, m.table): m.stats for m in p.maps}),
    )
    rehomed = [r for _, r in seen]
    seen = [s for s, _ in seen]
    if any(s != seen[0] for s in seen):
        raise StorageError(
            f"The ranks see different checkpoints under the name {names[0]} in {directory} "
            f"(a concurrent writer, or a file system that serves stale copies): nothing was "
            f"restored. (id, step, save number, world size) per rank: {seen}"
        )
    if all_or_nothing:
        shards, _ = _stage("restore (read)", lambda: list(_filled_shards(plan)))
        _stage("restore (write)", lambda: _apply(shards, plan.assigns, plan.maps))
    else:
        _stage(
            "restore (read and write)",
            lambda: _apply(_filled_shards(plan), plan.assigns, plan.maps),
        )
    if not any(rehomed):
        return plan.manifest.raw
    keymaps.print_notices(rehomed, plan.manifest.world_size)
    return dict(plan.manifest.raw, rehomed=rehomed)


def _resolve(directory):
    """Rank 0: the checkpoint ``latest`` names (None if there is none); others: nothing."""
    return latest_checkpoint(directory) if comm.rank() == 0 else None


def _identity(manifest) -> tuple:
    return (manifest.raw.get("id"), manifest.step, manifest.sequence, manifest.world_size)


def _plan_restore(model, directory, name) -> _Restore:
    path = inside(directory, name, what="checkpoint")
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
        raise StorageError(
            f"Checkpoint has embedding blocks {sorted(saved)} but the model "
            f"has {sorted(b.name for b in blocks)}. Received: "
            f"manifest={manifest.path}"
        )
    for block in blocks:
        tables = saved[block.name].plan.tables
        want = {t.name: (t.rows, t.dim) for t in tables}
        have = {t.name: (t.rows, t.dim) for t in block.tables}
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                raise StorageError(
                    f"Checkpoint does not match the model in block '{block.name}', table "
                    f"'{name}': checkpoint (rows, dim)={want.get(name)}, model "
                    f"(rows, dim)={have.get(name)}. Received: manifest={manifest.path}"
                )
        kinds = {t.name: _kind(t) for t in block.tables}
        for t in tables:  # a dynamic table's rows are found by key, a fixed one's by row
            if _kind(t) != kinds[t.name]:
                raise StorageError(
                    f"Checkpoint does not match the model in block '{block.name}', table "
                    f"'{t.name}': the checkpoint's table is {_kind(t)}, the model's "
                    f"{kinds[t.name]}. Received: manifest={manifest.path}"
                )
    return saved


def _kind(table) -> str:
    return "fixed" if table.dynamic is None else "dynamic"


def _plan_shard(plan, path, saved, block, shard, state, with_optimizer) -> None:
    """Adds the copies that fill this rank's ``shard`` (table and slots), files checked."""
    var, first = block.backend.shard_variable(shard)
    targets = dict(state.parts(var) if with_optimizer else [("table", var)])
    parts = {p.name: p for p in saved.parts[shard.table]}
    have = set(parts) if with_optimizer else {"table"}
    if set(targets) != have:
        raise StorageError(
            f"Checkpoint {path} holds {sorted(have)} for table '{shard.table}', the model "
            f"(optimizer {state.label}) needs {sorted(targets)}. Received: "
            f"checkpoint optimizer={plan.manifest.optimizer}"
        )
    for name, target in targets.items():
        part = parts[name]
        if numpy_dtype(target) != part.dtype:
            saved = part.saved_as or part.dtype.name
            raise StorageError(
                f"Checkpoint {path} holds table '{shard.table}' ({name}) as {saved}, the "
                f"model as {dtype_name(target)} (the block's table_dtype). Received: "
                f"dtype={saved}"
            )
        for old in saved.plan.stored_shards_of(shard.table):
            if _overlap(shard, old) is not None:
                file = shard_file(path, part.stem, old.rank)
                check_array(file, part.shape(old), part.dtype)
                plan.copies.append((file, old, part, target, shard, first))
    if shard.table in saved.maps:
        rehomed = keymaps.plan_map(path, saved, block, shard)
        plan.maps.append(rehomed)
        for name, target in targets.items():
            part = parts[name]
            plan.moves[id(target)] = [
                (shard_file(path, part.stem, old.rank), part.shape(old), part.dtype, src, dst)
                for old, src, dst in rehomed.moves
            ]


def _plan_dense(plan, path, manifest, state, with_optimizer) -> None:
    """Reads dense.npz (checked against the manifest) and pairs it with the model."""
    if len(manifest.dense) != len(state.dense):
        raise StorageError(
            f"Checkpoint has {len(manifest.dense)} dense weights, the model "
            f"{len(state.dense)}. Received: manifest={manifest.path}"
        )
    arrays = read_arrays(os.path.join(path, DENSE), manifest.dense_arrays())
    for i, (w, saved) in enumerate(zip(state.dense, manifest.dense)):
        _pair(plan, f"dense weight {i} ('{w.name}')", w, arrays[dense_key(i)], manifest)
        if not with_optimizer:
            continue
        slots = state.slots(w)
        names = [name for name, _, _ in saved.slots]
        if sorted(slots) != sorted(names):
            raise StorageError(
                f"Checkpoint {path} holds slots {sorted(names)} for dense weight {i} "
                f"('{w.name}'), the model's optimizer ({state.label}) has {sorted(slots)}. "
                f"Received: checkpoint optimizer={manifest.optimizer}"
            )
        for k, name in enumerate(names):
            _pair(
                plan,
                f"slot '{name}' of dense weight {i}",
                slots[name],
                arrays[dense_key(i, k)],
                manifest,
            )
    if with_optimizer:
        _plan_optimizer_state(plan, manifest, state, arrays)


def _plan_optimizer_state(plan, manifest, state, arrays) -> None:
    saved = [(tuple(shape), np.dtype(dtype)) for _, shape, dtype in manifest.state]
    have = [(tuple(v.shape), numpy_dtype(v)) for v in state.extra]
    if saved != have:
        raise StorageError(
            f"The optimizer state in {manifest.path} ({manifest.optimizer}: "
            f"{[n for n, _, _ in manifest.state]}) does not fit the model's optimizer "
            f"({state.label}: {[v.name for v in state.extra]}). Received: "
            f"optimizer={manifest.optimizer}"
        )
    for j, var in enumerate(state.extra):
        plan.assigns.append((var, arrays[state_key(j)]))


def _pair(plan, what, var, array, manifest) -> None:
    if tuple(var.shape) != array.shape or numpy_dtype(var) != array.dtype:
        raise StorageError(
            f"Checkpoint {manifest.path}: {what} is {array.dtype} {array.shape}, the model's "
            f"{numpy_dtype(var)} {tuple(var.shape)}. Received: shape={array.shape}"
        )
    plan.assigns.append((var, array))


def _overlap(shard, old):
    """``(r0, r1, c0, c1)``, the rectangle both shards cover, or None."""
    r0 = max(shard.row_start, old.row_start)
    r1 = min(shard.row_start + shard.rows, old.row_start + old.rows)
    c0 = max(shard.col_start, old.col_start)
    c1 = min(shard.col_start + shard.cols, old.col_start + old.cols)
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None


def _moved(plan, filled):
    """``filled`` with the rows of the dynamic-table keys that moved to another slot."""
    target, _, out = filled
    for file, shape, dtype, src, dst in plan.moves.get(id(target), ()):
        out[dst] = load_array(file, shape, dtype)[src]
    return filled


def _filled_shards(plan):
    """Yields ``(variable, first row, array)`` for each of this rank's shards, the array read
    from every saved rectangle it overlaps (the plan's tiling check guarantees it is filled);
    the previous array is let go before the next is made."""
    key, filled, done = None, None, set()
    for file, old, part, target, shard, first in plan.copies:
        if (id(target), first) != key:  # a target's copies are consecutive (_plan_shard)
            if filled is not None:
                yield _moved(plan, filled)
            done.add(key)
            filled = None
            key = (id(target), first)
            if key in done:  # a shard yielded before it was whole would be garbage
                raise AssertionError(f"restore plan: the copies of {target.name} are split")
            filled = (target, first, np.empty(part.shape(shard), part.dtype))
        try:
            # the mapped file is not held past the copy: its pages count as resident
            _copy(load_array(file, part.shape(old), part.dtype), old, shard, filled[2], part)
        except OSError as exc:
            raise StorageError(
                f"Cannot read checkpoint file {file} on rank {comm.rank()}: {exc}"
            ) from exc
    if filled is not None:
        yield _moved(plan, filled)


def _copy(data, old, shard, out, part) -> None:
    """Fills ``out`` (this rank's ``shard`` of ``part``) from the saved shard ``old``, in row
    chunks; a per-row part has one column, the same in every column slice of its rows."""
    r0, r1, c0, c1 = _overlap(shard, old)
    (new_c, _), (old_c, _) = part.columns(shard), part.columns(old)
    if part.per_row:
        c0, c1 = 0, 1
    step = max(1, CHUNK_BYTES // max(1, (c1 - c0) * data.dtype.itemsize))
    for lo in range(r0, r1, step):
        hi = min(r1, lo + step)
        out[lo - shard.row_start : hi - shard.row_start, c0 - new_c : c1 - new_c] = data[
            lo - old.row_start : hi - old.row_start, c0 - old_c : c1 - old_c
        ]


def _apply(shards, assigns, maps=()) -> None:
    for target, first, array in shards:
        array = from_disk(array, target.dtype.name)
        if first == 0 and tuple(target.shape) == array.shape:
            target.assign(array)
        else:
            target[first : first + len(array)].assign(array)
        del array  # a streamed shard goes before the next is read
    for var, array in assigns:
        var.assign(array)
    for rehomed in maps:
        rehomed.load()
