"""The un-pooled dynamic-sequence oracle's model and data, shared by the 2-rank test
(test_dynamic_sequences.py) and its one-process reference (run as
``python -m tests.ranks.dynamic_sequence_model IN.npz OUT.npz``, no Horovod).

The session model of :mod:`.session_model` (a GRU over the block's un-pooled item sequences,
``sequence_combiner=None``, beside a fixed ``user`` table) with its item sequences' ids as
large raw keys of a dynamic table. New keys keep arriving step after step, and the capacity
holds them all (no eviction). Data: ``item_seq__values`` / ``item_seq__lengths``, ``user``,
``label`` (what :func:`.session_model.dataset` batches as Merlin's Loader does).
"""

import json
import sys

import numpy as np
import tensorflow as tf

from tests.ranks import session_model as sc

FIRST_KEY = 10**12  # raw ids far above any fixed table
CAPACITY = 400  # rows over all ranks: more than the keys the data hold
LR = {"sgd": 0.5, "adagrad": 0.2, "adam": 0.02}


def schema():
    """The session schema with the item sequence as raw 64-bit keys (no domain)."""
    import merlin.dtypes as md
    from merlin.schema import ColumnSchema, Schema, Tags

    fixed = sc.schema()
    return Schema(
        [
            ColumnSchema(
                "item_seq",
                dtype=md.int64,
                tags=[Tags.CATEGORICAL, Tags.ITEM, Tags.ID, Tags.SEQUENCE],
                is_list=True,
                is_ragged=True,
                properties={"value_count": {"min": 1, "max": sc.MAX_LEN}},
            ),
            fixed["user"],
            fixed["label"],
        ]
    )


def build_model():
    import merlin.models.tf as mm

    from merlin_models_de import DynamicTable

    inputs = schema().excluding_by_tag("target")
    tf.keras.utils.set_random_seed(1)
    block = mm.DistributedEmbeddings(
        inputs,
        dim=8,
        sequence_combiner=None,
        dynamic_tables={"item_seq": DynamicTable(capacity=CAPACITY)},
        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1),
    )
    return mm.Model(
        mm.InputBlockV2(inputs, categorical=block, aggregation=None),
        sc.SessionEncoder(8),
        mm.MLPBlock([8]),
        mm.BinaryOutput("label"),
    )


def make_data(rows, steps, seed=0):
    """Sequences of 1..MAX_LEN keys drawn from a pool that grows each step, hot keys first."""
    rng = np.random.default_rng(seed)
    per_step = rows // steps
    lengths = rng.integers(1, sc.MAX_LEN + 1, rows)
    values = []
    for i, length in enumerate(lengths):
        pool = 20 + 15 * (i // per_step)
        weights = 1.0 / np.arange(1, pool + 1)
        values.append(rng.choice(pool, size=length, p=weights / weights.sum()))
    return {
        "item_seq__values": (FIRST_KEY + np.concatenate(values)).astype(np.int64),
        "item_seq__lengths": lengths,
        "user": rng.integers(0, sc.USERS, rows),
        "label": rng.integers(0, 2, rows),
    }


def reference(src, dst):
    """One process, the global batch: per optimizer, initial state, per-step losses, final
    state and the predictions of every row after training."""
    from tests.ranks import dynamic_model as dm
    from tests.ranks.oracle_dlrm import LossRecorder, optimizer

    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    batch = spec["per_rank"] * spec["world_size"]
    out = {}
    for name in spec["optimizers"]:
        model = build_model()
        model(next(iter(sc.dataset(data, 2)))[0])
        out.update({f"{name}/initial/{k}": v for k, v in dm.state(model).items()})
        model.compile(optimizer=optimizer(name, LR[name] * spec["world_size"]))
        losses = LossRecorder()
        model.fit(sc.dataset(data, batch), epochs=1, verbose=0, callbacks=[losses])
        out[f"{name}/losses"] = np.array(losses.losses)
        out.update({f"{name}/final/{k}": v for k, v in dm.state(model).items()})
        out[f"{name}/predictions"] = model.predict(sc.dataset(data, batch), verbose=0)
    np.savez(dst, **out)


if __name__ == "__main__":
    reference(sys.argv[1], sys.argv[2])
