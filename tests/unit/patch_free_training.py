"""Trains models that hold nothing of the package, with and without it imported, and writes
their weights: ``python -m tests.unit.patch_free_training OUT.npz [--with-package]``.

With ``--with-package``, ``merlin_models_de`` is imported and one model of it built first, so
that every process-wide patch is in place (the ones that go in lazily too). Each case is a
plain Keras model (an ``Embedding``, whose gradient is ``IndexedSlices``, and a ``Dense``) or
Merlin's ``DLRMModel`` with Merlin's own embeddings, trained ``STEPS`` steps by ``fit`` with
each optimizer below, every one from the same seed and data."""

import os
import sys

import numpy as np

STEPS, BATCH, ROWS_PER_TABLE = 3, 8, 20
OPTIMIZERS = ("SGD", "Adagrad", "Adam")


def optimizers():
    """``{name: () -> optimizer}``: Keras' new and legacy SGD, Adagrad and Adam."""
    import tensorflow as tf

    made = {}
    for name in OPTIMIZERS:
        made[f"new.{name}"] = lambda name=name: getattr(tf.keras.optimizers, name)(0.1)
        made[f"legacy.{name}"] = lambda name=name: getattr(tf.keras.optimizers.legacy, name)(0.1)
    return made


def data():
    """Two id features, two floats and a 0/1 target, ``STEPS * BATCH`` rows, fixed."""
    rng = np.random.default_rng(7)
    rows = STEPS * BATCH
    return {
        "c0": rng.integers(0, ROWS_PER_TABLE, rows),
        "c1": rng.integers(0, ROWS_PER_TABLE, rows),
        "f0": rng.random(rows, dtype=np.float32),
        "f1": rng.random(rows, dtype=np.float32),
        "click": rng.integers(0, 2, rows).astype(np.float32),
    }


def keras_model():
    import tensorflow as tf

    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    vectors = tf.keras.layers.Embedding(ROWS_PER_TABLE, 4)(ids)
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(vectors))
    return tf.keras.Model(ids, out)


def train_keras(make_optimizer, columns):
    model = keras_model()
    model.compile(make_optimizer(), loss="mse")
    model.fit(columns["c0"][:, None], columns["click"], batch_size=BATCH, shuffle=False, verbose=0)
    return model.get_weights()


def merlin_schema():
    from merlin.schema import ColumnSchema, Schema, Tags

    def ids(name):
        domain = {"min": 0, "max": ROWS_PER_TABLE - 1, "name": name}
        return ColumnSchema(
            name, dtype=np.int64, tags=[Tags.CATEGORICAL], properties={"domain": domain}
        )

    floats = [ColumnSchema(n, dtype=np.float32, tags=[Tags.CONTINUOUS]) for n in ("f0", "f1")]
    target = ColumnSchema("click", dtype=np.float32, tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])
    return Schema([ids("c0"), ids("c1"), *floats, target])


def train_merlin(make_optimizer, columns):
    import merlin.models.tf as mm
    import pandas as pd
    from merlin.io import Dataset

    schema = merlin_schema()
    model = mm.DLRMModel(
        schema,
        embedding_dim=4,
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryOutput("click"),
    )
    model.compile(make_optimizer())
    loader = mm.Loader(
        Dataset(pd.DataFrame(columns), schema=schema), batch_size=BATCH, shuffle=False
    )
    model.fit(loader, epochs=1, verbose=0)
    return model.get_weights()


def package_model():
    """A model holding the package's block, built: every lazy patch goes in."""
    import merlin.models.tf as mm

    import merlin_models_de
    from merlin_models_de.compat import registry

    schema = merlin_schema()
    model = mm.DLRMModel(
        schema,
        embeddings=merlin_models_de.DistributedEmbeddings(
            schema.excluding_by_name(["click"]), dim=4
        ),
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryOutput("click"),
    )
    model.compile("sgd")
    return registry.installed()


def main(out, with_package):
    import tensorflow as tf

    installed = package_model() if with_package else []
    if not with_package:
        assert not any(m.startswith("merlin_models_de") for m in sys.modules)
    tf.config.experimental.enable_op_determinism()
    columns, weights = data(), {}
    for kind, train in (("keras", train_keras), ("merlin", train_merlin)):
        for name, make in optimizers().items():
            tf.keras.utils.set_random_seed(0)
            for index, array in enumerate(train(make, columns)):
                weights[f"{kind}.{name}.{index}"] = array
    np.savez(out, installed=np.array(installed, dtype=str), **weights)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(sys.argv[1], "--with-package" in sys.argv[2:])
