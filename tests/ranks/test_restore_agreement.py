"""Every rank restores the same checkpoint, and a restore that fails on one rank writes
nothing on any rank (run under horovodrun -np 2).

A rank's view of the directory is simulated with a directory per rank: rank 0 and rank 1
pass different paths, as ranks would see different contents through a stale shared file
system or while a concurrent writer moves ``latest``."""

import errno
import os
import shutil

import numpy as np
import pytest

from merlin_models_de import comm
from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.persistence.layout import write_latest
from tests.ranks.test_checkpoint import fit, small_run


def state_of(model):
    return [w.numpy() for w in model.weights] + [v.numpy() for v in model.optimizer.variables()]


def assert_unchanged(model, before):
    for got, want in zip(state_of(model), before):
        np.testing.assert_array_equal(got, want)


def rank_views(directory, make_view):
    """Rank 0 sees ``directory``; the others a copy that ``make_view(copy)`` changes."""
    view = directory + "-view"
    if comm.rank() == 0:
        shutil.copytree(directory, view)
        make_view(view)
    comm.barrier()
    return directory if comm.rank() == 0 else view


def test_every_rank_restores_the_checkpoint_rank_0_resolves(hvd, tmp_path_factory):
    x, directory, model = small_run(tmp_path_factory, "agree", seed=21)
    save_checkpoint(model, directory, step=2)
    at_step_2 = state_of(model)
    fit(model, x, _labels(x))
    save_checkpoint(model, directory, step=3)
    if comm.rank() == 0:
        write_latest(directory, "ckpt-000000002")  # rank 0 sees step 2, rank 1 step 3
    mine = rank_views(directory, lambda view: write_latest(view, "ckpt-000000003"))

    restored = restore_checkpoint(model, mine)
    steps = comm.allgather_object(restored["step"])
    assert steps == [2] * comm.size()
    assert_unchanged(model, at_step_2)  # every rank's shards, dense weights and slots


def _labels(x):
    return np.zeros((len(next(iter(x.values()))), 1), np.float32)


def test_ranks_that_see_different_checkpoints_all_stop(hvd, tmp_path_factory):
    x, directory, model = small_run(tmp_path_factory, "differ", seed=22)
    save_checkpoint(model, directory, step=2)
    other = directory + "-other"
    fit(model, x, _labels(x))
    save_checkpoint(model, other, step=2)  # the same name, another save

    def replace(view):
        shutil.rmtree(os.path.join(view, "ckpt-000000002"))
        shutil.copytree(os.path.join(other, "ckpt-000000002"), os.path.join(view, "ckpt-000000002"))

    mine = rank_views(directory, replace)
    before = state_of(model)
    with pytest.raises(
        StorageError,
        match=r"The ranks see different checkpoints under the "
        r"name ckpt-000000002 .*nothing was restored",
    ):
        restore_checkpoint(model, mine)
    assert_unchanged(model, before)
    comm.barrier()


def test_a_read_error_on_one_rank_leaves_every_rank_untouched(hvd, tmp_path_factory, monkeypatch):
    x, directory, model = small_run(tmp_path_factory, "read_error", seed=23)
    save_checkpoint(model, directory)
    fit(model, x, _labels(x))
    before = state_of(model)
    if comm.rank() == 1:

        def fail_reads(file, *args, **kwargs):  # every shard file mapped
            raise OSError(errno.EIO, "Input/output error", file.name)

        monkeypatch.setattr(np, "memmap", fail_reads)
    expected = (
        r"Cannot read checkpoint file .* on rank 1: .*Input/output error"
        if comm.rank() == 1
        else r"failed on rank 1: .*Input/output error"
    )
    with pytest.raises(StorageError, match=expected):
        restore_checkpoint(model, directory)
    monkeypatch.undo()
    assert_unchanged(model, before)
    comm.barrier()
