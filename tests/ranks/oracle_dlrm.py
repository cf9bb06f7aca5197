"""The fit oracle's DLRM: its schema, model, data, optimizers and weight snapshots, shared by
the 2-rank tests, their one-process reference runs and the multi-host jobs."""

import numpy as np
import tensorflow as tf

SCHEMA_ROWS = 999


def schema():
    from merlin_models_de.apps.common.schemas import synthetic_schema
    from tests.schemas import capped_schema

    return capped_schema(synthetic_schema("criteo"), SCHEMA_ROWS)


def small_schema():
    """A few of the columns (the 2 largest and the 2 smallest tables, 2 continuous, the
    label), for tests that save a SavedModel: Keras traces every layer (~2 minutes a save
    for all 26 tables here)."""
    from merlin.schema import Tags

    s = schema()
    tables = sorted(s.select_by_tag(Tags.CATEGORICAL), key=lambda c: (c.int_domain.max, c.name))
    return s.select_by_name([c.name for c in tables[:2] + tables[-2:]] + ["I1", "I2", "label"])


def only_columns(data, columns):
    """``data`` (column -> array) restricted to ``columns``."""
    return {k: v for k, v in data.items() if k in set(columns)}


def build_model(spec):
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    s = small_schema() if spec.get("small") else schema()
    tf.keras.utils.set_random_seed(1)
    model = mm.DLRMModel(
        s,
        embeddings=mm.DistributedEmbeddings(
            s,
            dim=8,
            strategy=spec["strategy"],
            column_slice_threshold=spec.get("column"),
            backend=spec.get("backend", "auto"),
            **spec.get("block_options", {}),
        ),
        bottom_block=mm.MLPBlock([8]),
        top_block=mm.MLPBlock([8]),
        prediction_tasks=mm.BinaryClassificationTask("label"),
    )
    if spec.get("tables_only"):  # only the tables train: no gradient is allreduced
        for layer in model.submodules:
            if isinstance(layer, tf.keras.layers.Dense):
                layer.trainable = False
    return model


def make_data(rows, seed):
    from merlin.datasets.synthetic import generate_data

    df = generate_data(schema(), rows).to_ddf().compute()
    rng = np.random.default_rng(seed)
    df = df.iloc[rng.permutation(len(df))].reset_index(drop=True)
    return {c: df[c].to_numpy() for c in df.columns}


def split_xy(data, spec):
    x = {k: v.reshape(-1, 1) for k, v in data.items() if k != "label"}
    return x, data["label"].reshape(-1, 1).astype(np.float32)


def take(x, lo, hi):
    return {k: tf.constant(v[lo:hi]) for k, v in x.items()}


def rank_rows(total, per_rank, world_size, rank):
    """Rows of ``rank``: its slice of every global batch, so rank batches concat to it."""
    batch = per_rank * world_size
    return np.concatenate(
        [
            np.arange(start + rank * per_rank, start + (rank + 1) * per_rank)
            for start in range(0, total, batch)
        ]
    )


def optimizer(name, lr):
    from merlin_models_de import RowWiseAdagrad

    legacy = tf.keras.optimizers.legacy
    return {
        "sgd": legacy.SGD,
        "adagrad": legacy.Adagrad,
        "adam": legacy.Adam,
        "rowwise_adagrad": RowWiseAdagrad,
    }[name](lr)


def snapshot(model):
    """{'dense/i': array, 'table/<name>': array}: full tables (collective) and dense weights."""
    from merlin_models_de.variables import dense_weights, embedding_blocks

    blocks = embedding_blocks(model)
    out = {f"dense/{i}": w.numpy() for i, w in enumerate(dense_weights(model, blocks))}
    for block in blocks:  # 16-bit tables in float32 (exact): np.savez cannot hold bfloat16
        out.update(
            {f"table/{k}": np.asarray(v, np.float32) for k, v in block.get_global_weights().items()}
        )
    return out


def restore(model, weights, prefix):
    from merlin_models_de.variables import dense_weights, embedding_blocks

    blocks = embedding_blocks(model)
    for i, w in enumerate(dense_weights(model, blocks)):
        w.assign(weights[f"{prefix}/dense/{i}"])
    tables = {k.split("/", 2)[2]: v for k, v in weights.items() if k.startswith(f"{prefix}/table/")}
    for block in blocks:
        block.set_global_weights({t.name: tables[t.name] for t in block.tables})


class LossRecorder(tf.keras.callbacks.Callback):
    """Per-step values of the log ``key`` (Merlin logs the batch loss as ``loss_batch``, the
    sum of ``model.losses`` as ``regularization_loss``)."""

    def __init__(self, key="loss_batch"):
        super().__init__()
        self.key, self.losses = key, []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs[self.key]))


def fault_job_model(steps_per_rank, comm):
    """The fault jobs' model (Adagrad, memory_balanced, 8 rows a rank and step) compiled, with
    this rank's rows of data for ``steps_per_rank`` steps: ``(model, x, y, rows)``."""
    spec = dict(
        optimizer="adagrad",
        lr=0.05,
        strategy="memory_balanced",
        column=None,
        world_size=comm.size(),
        per_rank=8,
    )
    data = comm.broadcast_object(make_data(comm.size() * 8 * steps_per_rank, seed=9))
    x, y = split_xy(data, spec)
    rows = rank_rows(len(y), 8, comm.size(), comm.rank())
    model = build_model(spec)
    model.compile(optimizer=optimizer("adagrad", 0.05))
    return model, x, y, rows
