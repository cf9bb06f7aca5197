"""A small one-process model for the checkpoint tests: an embedding block and a dense head,
and a checkpoint of it (the ``saved`` fixture: import it into a test module to use it)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.persistence.checkpoint import save_checkpoint

COLUMNS = ("a", "b", "c")
ROWS = (50, 30, 10)


def schema(columns=COLUMNS, rows=ROWS):
    from merlin.schema import Schema

    from tests.schemas import cat

    return Schema([cat(name, n - 1) for name, n in zip(columns, rows)])


class Tiny(tf.keras.Model):
    """The block's outputs, concatenated, into one dense unit."""

    def __init__(self, columns=COLUMNS, dim=4, rows=ROWS):
        from merlin_models_de import DistributedEmbeddings

        super().__init__()
        self.emb = DistributedEmbeddings(schema(columns, rows), dim=dim)
        self.head = tf.keras.layers.Dense(1)

    def call(self, inputs):
        out = self.emb(inputs)
        return self.head(tf.concat([out[k] for k in sorted(out)], axis=1))


def data(rows=64, seed=0, columns=COLUMNS):
    rng = np.random.default_rng(seed)
    x = {c: rng.integers(0, 10, (rows, 1)) for c in columns}
    return x, rng.random((rows, 1)).astype(np.float32)


def build(optimizer=None, seed=1, columns=COLUMNS, rows=ROWS, **compile_args):
    """A built Tiny model (compiled when ``optimizer`` is given: a zero-argument factory)."""
    tf.keras.utils.set_random_seed(seed)
    model = Tiny(columns, rows=rows)
    x, _ = data(columns=columns)
    model({k: v[:2] for k, v in x.items()})
    if optimizer is not None:
        model.compile(optimizer(), "mse", **compile_args)
    return model


def fit(model, steps=4, seed=0):
    x, y = data(16 * steps, seed, columns=[f.name for f in model.emb.features])
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)


def weights(model):
    """Every weight of the model, by position."""
    return [w.numpy() for w in model.weights]


def files_under(root):
    """Every file below ``root``, relative to it."""
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def legacy_adagrad():
    return tf.keras.optimizers.legacy.Adagrad(0.1)


def ckpt_dirs(directory):
    """The checkpoint directories in ``directory``, by name."""
    return sorted(n for n in os.listdir(directory) if n.startswith("ckpt-"))


@pytest.fixture(name="saved")
def saved_checkpoint(tmp_path):
    """(checkpoint directory, a trained compiled model saved there at step 4)."""
    model = build(legacy_adagrad)
    fit(model)
    directory = str(tmp_path / "ckpt")
    save_checkpoint(model, directory)
    return directory, model
