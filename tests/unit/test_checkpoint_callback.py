"""CheckpointCallback: a step is saved once, and with several steps per call the checkpoint
of each multiple of every_n_steps is saved at the first batch end at or after it."""

import pytest
import tensorflow as tf

from merlin_models_de.persistence import checkpoint
from merlin_models_de.persistence.checkpoint import CheckpointCallback
from merlin_models_de.persistence.layout import parse_name
from tests.unit import checkpoint_helpers as ch


class _FakeModel:
    def __init__(self):
        self.optimizer = type("Opt", (), {"iterations": tf.Variable(0, dtype=tf.int64)})()


def test_the_callback_saves_each_step_once(monkeypatch, tmp_path):
    saves = []
    monkeypatch.setattr(
        checkpoint,
        "save_checkpoint",
        lambda model, directory, step=None, keep=None: saves.append((step, keep)),
    )
    callback = CheckpointCallback(str(tmp_path), every_n_steps=2, keep=3)
    model = _FakeModel()
    callback.set_model(model)
    for epoch in range(2):
        for batch in range(4):  # every_n_steps divides the steps per epoch
            model.optimizer.iterations.assign_add(1)
            callback.on_train_batch_end(batch)
        callback.on_epoch_end(epoch)
    assert saves == [(2, 3), (4, 3), (6, 3), (8, 3)]


@pytest.mark.parametrize(
    "every, per_call, saved",
    [(6, 4, [8, 12, 20, 24]), (5, 8, [8, 16, 24]), (4, 1, [4, 8, 12, 16, 20, 24])],
)
def test_the_callback_saves_at_the_first_batch_end_past_each_multiple(
    tmp_path, every, per_call, saved
):
    directory = str(tmp_path / "ckpt")
    model = ch.build(ch.legacy_adagrad, steps_per_execution=per_call)
    x, y = ch.data(16 * 24)
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[CheckpointCallback(directory, every_n_steps=every, each_epoch=False)],
    )
    assert [parse_name(n)[0] for n in ch.ckpt_dirs(directory)] == saved
