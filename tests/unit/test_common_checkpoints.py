"""The commands' checkpoint options (apps/common/checkpoints.py): how many are kept, and the
callback made only where a directory is given."""

from types import SimpleNamespace

from merlin_models_de.apps.common.checkpoints import (
    DEFAULT_KEEP,
    checkpoint_callback,
    checkpoints_kept,
)


def _args(**kw):
    return SimpleNamespace(**{"checkpoint_dir": None, "checkpoint_every": None, **kw})


def test_kept_checkpoints_default_to_a_few_and_0_keeps_every_one():
    assert checkpoints_kept(_args(checkpoint_keep=None)) == DEFAULT_KEEP
    assert checkpoints_kept(_args(checkpoint_keep=0)) is None
    assert checkpoints_kept(_args(checkpoint_keep=5)) == 5


def test_a_callback_only_with_a_directory(tmp_path):
    assert checkpoint_callback(_args(checkpoint_keep=None)) is None
    callback = checkpoint_callback(
        _args(checkpoint_dir=str(tmp_path), checkpoint_every=4, checkpoint_keep=2)
    )
    assert type(callback).__name__ == "CheckpointCallback"
    assert str(tmp_path) in vars(callback).values() and 2 in vars(callback).values()
