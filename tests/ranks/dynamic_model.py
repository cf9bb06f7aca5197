"""The dynamic-table oracle's model and data, shared by the 2-rank test and its one-process
reference (run as ``python -m tests.ranks.dynamic_model IN.npz OUT.npz``, no Horovod).

A DLRM with a fixed ``user`` table, a one-hot dynamic ``item`` table and a multi-hot
dynamic ``history`` table (lists of 3 keys, pooled by mean), whose keys are large raw ids; new keys keep
arriving step after step, and the capacity holds them all (no eviction).
"""

import json
import sys

import numpy as np
import tensorflow as tf

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
LR = {"sgd": 0.5, "adagrad": 0.2, "rowwise_adagrad": 0.2, "adam": 0.02}
FIRST_KEY = 10**12  # raw ids far above any fixed table
HISTORY = 3  # keys in a sample's history (a fixed-length list: Merlin's fit takes no ragged)


def schema():
    import merlin.dtypes as md
    from merlin.schema import ColumnSchema, Schema, Tags

    from tests.schemas import cat

    return Schema(
        [
            cat("user", 49),
            ColumnSchema("item", dtype=md.int64, tags=[Tags.CATEGORICAL, Tags.ITEM_ID]),
            ColumnSchema(
                "history",
                dtype=md.int64,
                tags=[Tags.CATEGORICAL],
                is_list=True,
                is_ragged=False,
                properties={"value_count": {"min": HISTORY, "max": HISTORY}},
            ),
            ColumnSchema("x", dtype=md.float32, tags=[Tags.CONTINUOUS]),
            ColumnSchema("label", dtype=md.float32, tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]),
        ]
    )


def build_model(dynamic_tables):
    import merlin.models.tf as mm
    from merlin.schema import Tags

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    s = schema()
    tf.keras.utils.set_random_seed(3)
    return mm.DLRMModel(
        s,
        embeddings=mm.DistributedEmbeddings(
            s.select_by_tag(Tags.CATEGORICAL),
            dim=4,
            dynamic_tables=dynamic_tables,
            embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1),
        ),
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryClassificationTask("label"),
    )


def no_eviction():
    from merlin_models_de import DynamicTable

    return {"item": DynamicTable(capacity=400), "history": DynamicTable(capacity=400)}


def make_data(samples, steps, seed=0):
    """Keys drawn from a pool that grows each step (new items keep arriving), hot keys first."""
    rng = np.random.default_rng(seed)
    per_step = samples // steps

    def keys(size, step):
        pool = 15 + 12 * step
        weights = 1.0 / np.arange(1, pool + 1)
        return FIRST_KEY + rng.choice(pool, size=size, p=weights / weights.sum())

    item = np.concatenate([keys(per_step, s) for s in range(steps)])
    history = np.stack([keys(HISTORY, i // per_step) for i in range(samples)])
    label = (rng.random(samples) < 0.4).astype(np.float32)
    return {
        "user": rng.integers(0, 50, samples),
        "item": item.astype(np.int64),
        "history": history.astype(np.int64),
        "x": rng.random(samples).astype(np.float32),
        "label": label,
    }


def inputs(data, rows):
    """Model inputs of ``rows``, and their labels."""
    x = {
        "user": tf.constant(data["user"][rows, None], tf.int64),
        "item": tf.constant(data["item"][rows, None], tf.int64),
        "history": tf.constant(data["history"][rows], tf.int64),
        "x": tf.constant(data["x"][rows, None]),
    }
    return x, data["label"][rows, None]


def dataset(data, rows, batch):
    x, y = inputs(data, rows)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def state(model) -> dict:
    """Dense weights, the fixed table, the default rows and the dynamic tables by key."""
    from merlin_models_de.variables import dense_weights, embedding_blocks

    (block,) = embedding_blocks(model)
    out = {f"dense/{i}": w.numpy() for i, w in enumerate(dense_weights(model, [block]))}
    out["table/user"] = block.backend.get_table("user", 2**26)
    for table, row in block.backend.defaults.items():
        out[f"default/{table}"] = row.numpy()
        keys, rows = block.dynamic_table(table)
        out[f"keys/{table}"], out[f"rows/{table}"] = keys, rows
    return out


def start_like(model, initial) -> None:
    """``model``'s dense weights, fixed table and default rows set to ``initial``'s."""
    from merlin_models_de.variables import dense_weights, embedding_blocks

    (block,) = embedding_blocks(model)
    for i, w in enumerate(dense_weights(model, [block])):
        w.assign(initial[f"dense/{i}"])
    block.backend.set_table("user", initial["table/user"], None, 2**26)
    for table, row in block.backend.defaults.items():
        row.assign(initial[f"default/{table}"])


def reference(src, dst):
    """One process, the global batch: per optimizer, initial state, per-step losses, final."""
    from tests.ranks.oracle_dlrm import LossRecorder, optimizer

    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    batch = spec["per_rank"] * spec["world_size"]
    out = {}
    for name in spec.get("optimizers", OPTIMIZERS):
        model = build_model(no_eviction())
        x, _ = inputs(data, np.arange(2))
        model(x)
        out.update({f"{name}/initial/{k}": v for k, v in state(model).items()})
        model.compile(optimizer=optimizer(name, LR[name] * spec["world_size"]))
        losses = LossRecorder()
        rows = np.arange(len(data["label"]))
        model.fit(dataset(data, rows, batch), epochs=1, verbose=0, callbacks=[losses])
        out[f"{name}/losses"] = np.array(losses.losses)
        out.update({f"{name}/final/{k}": v for k, v in state(model).items()})
    np.savez(dst, **out)


if __name__ == "__main__":
    reference(sys.argv[1], sys.argv[2])
