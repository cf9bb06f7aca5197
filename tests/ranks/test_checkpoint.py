"""Sharded checkpoints: resume equals an uninterrupted run (optimizer state included);
restore across world sizes and strategies; clear errors on mismatch, raised on every rank
when one rank finds a bad file; a crash mid-save keeps the last checkpoint."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.variables import optimizer_parts, optimizer_variables, slots_of
from tests.ranks import oracle_dlrm as fc
from tests.ranks.one_process import one_process_env

PER_RANK = 16


def spec_for(strategy="basic", column=None, optimizer="adagrad"):
    return dict(
        optimizer=optimizer,
        lr=0.05,
        strategy=strategy,
        column=column,
        world_size=comm.size(),
        per_rank=PER_RANK,
    )


def shared_dir(factory, name):
    return comm.broadcast_object(str(factory.mktemp(name)) if comm.rank() == 0 else None)


def rank_data(data, spec):
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), PER_RANK, comm.size(), comm.rank())
    return {k: v[rows] for k, v in x.items()}, y[rows]


def make_optimizer(name, lr):
    """The legacy optimizers of oracle_dlrm, and Keras' new-style ones as ``keras_<name>``."""
    new_style = {
        "keras_adagrad": tf.keras.optimizers.Adagrad,
        "keras_nadam": tf.keras.optimizers.Nadam,
    }
    return new_style[name](lr) if name in new_style else fc.optimizer(name, lr)


def compiled(spec, x):
    model = fc.build_model(spec)
    model(fc.take(x, 0, 2))
    model.compile(optimizer=make_optimizer(spec["optimizer"], spec["lr"]))
    return model


def optimizer_state(model):
    """{what: array} of this rank: every slot of every weight, and the other optimizer
    variables (iterations)."""
    opt, out, seen = model.optimizer, {}, set()
    for i, w in enumerate(model.weights):
        for name, s in slots_of(opt, w).items():
            out[f"{i}/{name}"] = s.numpy()
            seen.add(s.ref())
    others = [v for p in optimizer_parts(opt) for v in optimizer_variables(p)]
    for j, v in enumerate(v for v in others if v.ref() not in seen):
        out[f"other/{j}"] = v.numpy()
    return out


def fit(model, x, y):
    model.fit(x, y, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)


def assert_same_checkpoint_contents(a, b):
    full_a, full_b = read_full_tables(latest_checkpoint(a)), read_full_tables(latest_checkpoint(b))
    assert full_a.keys() == full_b.keys()
    for block in full_a:
        assert full_a[block].keys() == full_b[block].keys()
        for table, parts in full_a[block].items():
            assert parts.keys() == full_b[block][table].keys() == {"table", "accumulator"}
            for what, value in parts.items():
                np.testing.assert_allclose(
                    full_b[block][table][what], value, rtol=1e-6, err_msg=f"{table}/{what}"
                )


@pytest.mark.parametrize(
    "optimizer",
    [  # slots of 2 kinds, 2 APIs
        "adam",
        pytest.param("keras_adagrad", marks=pytest.mark.full),
    ],
)
def test_resume_equals_an_uninterrupted_run(hvd, tmp_path_factory, optimizer):
    spec = spec_for("memory_balanced", column=4000, optimizer=optimizer)
    data = comm.broadcast_object(fc.make_data(4 * comm.size() * PER_RANK, seed=5))
    half = len(data["label"]) // 2
    first = {k: v[:half] for k, v in data.items()}
    second = {k: v[half:] for k, v in data.items()}
    directory = shared_dir(tmp_path_factory, "resume")

    x1, y1 = rank_data(first, spec)
    x2, y2 = rank_data(second, spec)
    model = compiled(spec, x1)
    fit(model, x1, y1)
    save_checkpoint(model, directory)
    saved = optimizer_state(model)
    fit(model, x2, y2)
    uninterrupted = fc.snapshot(model)

    resumed = compiled(spec, x1)
    manifest = restore_checkpoint(resumed, directory)
    assert manifest["step"] == 2 and manifest["world_size"] == comm.size()
    restored = optimizer_state(resumed)
    assert restored.keys() == saved.keys() and len(saved) > 2
    for key, value in saved.items():
        np.testing.assert_array_equal(restored[key], value, err_msg=key)
    fit(resumed, x2, y2)
    for key, value in fc.snapshot(resumed).items():
        np.testing.assert_allclose(value, uninterrupted[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.full  # across world sizes: also tests/multihost/test_train.py (2 hosts <-> 1)
def test_restore_across_strategies_and_world_sizes(hvd, tmp_path_factory):
    data = comm.broadcast_object(fc.make_data(2 * comm.size() * PER_RANK, seed=6))
    basic = spec_for("basic")
    x, y = rank_data(data, basic)
    saved, balanced, single, back = (
        shared_dir(tmp_path_factory, n) for n in ("saved", "balanced", "single", "back")
    )
    model = compiled(basic, x)
    fit(model, x, y)
    save_checkpoint(model, saved)

    # basic -> memory_balanced with column slices, same world size
    other = compiled(spec_for("memory_balanced", column=3000), x)
    restore_checkpoint(other, saved)
    save_checkpoint(other, balanced)
    assert_same_checkpoint_contents(saved, balanced)

    # 2 -> 1 (a plain process restores, saves, and trains on), then 1 -> 2
    if comm.rank() == 0:
        path = os.path.join(single, "..", "data.npz")
        np.savez(path, **data)
        env = one_process_env()
        spec = dict(basic, world_size=1, strategy="memory_optimized")
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.ranks.checkpoint_reference",
                json.dumps(spec),
                path,
                saved,
                single,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert_same_checkpoint_contents(saved, single)
    comm.barrier()
    again = compiled(spec_for("memory_optimized", column=2000), x)
    restore_checkpoint(again, single)
    save_checkpoint(again, back)
    assert_same_checkpoint_contents(single, back)
    fit(again, x, y)  # training goes on


def small_run(tmp_path_factory, name, seed):
    """(inputs of this rank, checkpoint directory, compiled model) on a one-step dataset."""
    data = comm.broadcast_object(fc.make_data(comm.size() * PER_RANK, seed=seed))
    spec = spec_for()
    x, _ = rank_data(data, spec)
    return x, shared_dir(tmp_path_factory, name), compiled(spec, x)


def test_mismatched_checkpoint_names_the_table(hvd, tmp_path_factory):
    x, directory, model = small_run(tmp_path_factory, "mismatch", seed=7)
    save_checkpoint(model, directory)
    import merlin.models.tf as mm

    s = fc.schema()
    wider = mm.DLRMModel(
        s,
        embeddings=mm.DistributedEmbeddings(s, dim=16),
        bottom_block=mm.MLPBlock([16]),
        top_block=mm.MLPBlock([8]),
        prediction_tasks=mm.BinaryClassificationTask("label"),
    )
    wider(fc.take(x, 0, 2))
    with pytest.raises(
        ValueError,
        match=r"table 'C1': checkpoint \(rows, dim\)=\(1000, 8\), "
        r"model \(rows, dim\)=\(1000, 16\)",
    ):
        restore_checkpoint(wider, directory)
    comm.barrier()


def test_interrupted_save_keeps_the_last_checkpoint(hvd, tmp_path_factory):
    _, directory, model = small_run(tmp_path_factory, "atomic", seed=8)
    first = save_checkpoint(model, directory, step=1)
    if comm.rank() == 0:  # what a crash mid-save leaves: a partial temporary directory
        os.makedirs(os.path.join(directory, ".tmp-crashed", "tables"))
    comm.barrier()
    assert latest_checkpoint(directory) == os.path.realpath(first)
    assert restore_checkpoint(model, directory)["step"] == 1
    # the next save removes the leftover; keep=1 the older checkpoint; a re-save of the
    # step gets a new name, and the copy it replaces goes once `latest` names the new one
    save_checkpoint(model, directory, step=2, keep=1)
    again = save_checkpoint(model, directory, step=2, keep=1)
    comm.barrier()
    assert sorted(os.listdir(directory)) == ["ckpt-000000002-1", "latest"]
    assert latest_checkpoint(directory) == os.path.realpath(again)
    assert restore_checkpoint(model, directory)["step"] == 2


def test_a_bad_file_on_one_rank_fails_every_rank(hvd, tmp_path_factory):
    x, directory, model = small_run(tmp_path_factory, "bad_file", seed=10)
    path = save_checkpoint(model, directory)
    # a shard only the last rank saved (same plan: only that rank reads it when restoring)
    reader = comm.size() - 1
    bad = os.path.realpath(
        os.path.join(
            path,
            [
                f
                for f in sorted(
                    os.path.relpath(os.path.join(d, n), path)
                    for d, _, names in os.walk(path)
                    for n in names
                )
                if os.path.basename(f) == f"table-r{reader}.npy"
            ][0],
        )
    )
    if comm.rank() == 0:
        with open(bad, "r+b") as f:
            f.truncate(os.path.getsize(bad) - 4)
    comm.barrier()

    other = compiled(spec_for(), x)
    before = [w.numpy() for w in other.weights]
    own = f"{re.escape(bad)} is truncated"
    expected = own if comm.rank() == reader else f"failed on rank {reader}: .*{own}"
    with pytest.raises(StorageError, match=expected):
        restore_checkpoint(other, directory)
    for got, want in zip([w.numpy() for w in other.weights], before):
        np.testing.assert_array_equal(got, want)
    comm.barrier()


def test_an_unsupported_optimizer_is_named_on_every_rank(hvd, tmp_path_factory):
    data = comm.broadcast_object(fc.make_data(comm.size() * PER_RANK, seed=11))
    spec = spec_for(optimizer="keras_nadam")
    x, y = rank_data(data, spec)
    model = compiled(spec, x)
    fit(model, x, y)
    directory = shared_dir(tmp_path_factory, "unsupported")
    with pytest.raises(NotImplementedError, match="state of Nadam.*Received: optimizer=Nadam"):
        save_checkpoint(model, directory)
    comm.barrier()
    assert os.listdir(directory) == []
