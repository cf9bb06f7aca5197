"""Optimizer state in checkpoints (one process): every optimizer Merlin's compile accepts is
saved and restored in full (slots of tables and dense weights, iterations, other scalars), so
training resumes exactly; or the checkpoint refuses it, naming it."""

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
from merlin_models_de.variables import optimizer_parts, optimizer_variables, slot_names, slots_of
from tests.unit import checkpoint_helpers as ch


def _multi_optimizer(model):
    import merlin.models.tf as mm

    return mm.MultiOptimizer(
        default_optimizer=tf.keras.optimizers.legacy.Adam(0.05),
        optimizers_and_blocks=[
            mm.OptimizerBlocks(tf.keras.optimizers.legacy.Adagrad(0.1), [model.emb])
        ],
    )


def _lazy_adam(_):
    import merlin.models.tf as mm

    return mm.LazyAdam(0.05)


OPTIMIZERS = {
    "legacy Adagrad": lambda _: tf.keras.optimizers.legacy.Adagrad(0.1),
    "legacy Adam": lambda _: tf.keras.optimizers.legacy.Adam(0.05),
    "legacy Nadam": lambda _: tf.keras.optimizers.legacy.Nadam(0.05),  # + momentum_cache
    "Adagrad": lambda _: tf.keras.optimizers.Adagrad(0.1),
    "Adam amsgrad": lambda _: tf.keras.optimizers.Adam(0.05, amsgrad=True),
    "SGD momentum": lambda _: tf.keras.optimizers.SGD(0.1, momentum=0.9),
    "RMSprop centered": lambda _: tf.keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "Ftrl": lambda _: tf.keras.optimizers.Ftrl(0.1),
    "LazyAdam": _lazy_adam,
    "MultiOptimizer": _multi_optimizer,
}


def compiled(make, seed=1):
    tf.keras.utils.set_random_seed(seed)
    model = ch.Tiny()
    x, _ = ch.data()
    model({k: v[:2] for k, v in x.items()})
    model.compile(make(model), "mse")
    return model


def optimizer_state(model):
    """{what: array}: every slot of every weight, and every other optimizer variable."""
    opt = model.optimizer
    out, seen = {}, set()
    for i, w in enumerate(model.weights):
        for name, s in slots_of(opt, w).items():
            out[f"{i}/{name}"] = s.numpy()
            seen.add(s.ref())
    j = 0
    for part in optimizer_parts(opt):
        for v in optimizer_variables(part):
            if v.ref() not in seen:
                seen.add(v.ref())
                out[f"other/{j}"] = v.numpy()
                j += 1
    return out


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_round_trips_and_training_resumes_exactly(tmp_path, name):
    make = OPTIMIZERS[name]
    model = compiled(make)
    ch.fit(model, steps=3)
    save_checkpoint(model, str(tmp_path))
    saved = optimizer_state(model)
    assert any(k.startswith("other/") for k in saved)  # iterations at least
    assert len(saved) > 1 + 2  # slots of the tables and of the dense weights

    resumed = compiled(make, seed=2)
    restore_checkpoint(resumed, str(tmp_path))
    restored = optimizer_state(resumed)
    assert restored.keys() == saved.keys()
    for key, value in saved.items():
        np.testing.assert_array_equal(restored[key], value, err_msg=key)

    ch.fit(model, steps=2, seed=7)
    ch.fit(resumed, steps=2, seed=7)
    for got, want in zip(ch.weights(resumed), ch.weights(model)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_slot_names_of_a_new_style_optimizer():
    assert slot_names(tf.keras.optimizers.Adam(amsgrad=True)) == ["m", "v", "vhat"]
    assert slot_names(tf.keras.optimizers.Adagrad()) == ["accumulator"]
    legacy = tf.keras.optimizers.legacy.Adagrad()
    keras_compat.create_optimizer_slots(legacy, [tf.Variable(tf.zeros([2, 2]))])
    assert slot_names(legacy) == ["accumulator"]  # legacy ones know theirs once made


UNSUPPORTED = {
    "Nadam": (lambda _: tf.keras.optimizers.Nadam(0.05), "state of Nadam: it keeps _u_product"),
    "Adafactor": (
        lambda _: tf.keras.optimizers.Adafactor(0.05),
        "slot '[rc]' of Adafactor for the sharded table",
    ),
    "LossScaleOptimizer": (
        lambda _: tf.keras.mixed_precision.LossScaleOptimizer(
            tf.keras.optimizers.legacy.Adam(0.05)
        ),
        "state of LossScaleOptimizer",
    ),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_an_optimizer_whose_state_cannot_be_saved_is_named(tmp_path, name):
    make, message = UNSUPPORTED[name]
    model = compiled(make)
    ch.fit(model, steps=1)
    with pytest.raises(NotImplementedError, match=f"{message}.*Received: optimizer={name}"):
        save_checkpoint(model, str(tmp_path))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    save_checkpoint(ch.build(), str(tmp_path))  # a checkpoint without optimizer state
    with pytest.raises(NotImplementedError, match=f"Received: optimizer={name}"):
        restore_checkpoint(compiled(make), str(tmp_path))
