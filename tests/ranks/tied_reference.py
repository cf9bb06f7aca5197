"""A next-item model with a weight-tied output, and its single-process reference run.

Shared by tests/ranks/test_tied_output.py (2 ranks) and tests/unit/test_outputs_tied.py
(one process). The model: a user id and the previous item (the item table, ``item``) ->
concatenated embeddings -> a dense layer to the table's width -> ``CategoricalOutput`` tied to
the item table, predicting ``next_item``.

Usage: python -m tests.ranks.tied_reference IN.npz OUT.npz
(a plain subprocess without Horovod): builds the model at world size 1, where the tied output
is Merlin's own (full logits, categorical cross-entropy), records its initial weights, trains
one epoch on the global data with the global batch and N times the learning rate, and saves
the weights, per-step losses and evaluate()'s loss after training.
"""

import json
import sys

import numpy as np
import tensorflow as tf

ITEMS, USERS, DIM = 50, 20, 8
TARGET = "next_item"


def schema():
    from merlin.schema import Schema

    from tests.schemas import cat

    return Schema([cat("user", USERS - 1), cat("prev_item", ITEMS - 1, domain_name="item")])


def dense_layer():
    return tf.keras.layers.Dense(DIM, name="to_item_space")


def build_model(spec):
    """``spec``: ``block`` ("mm": mm.Embeddings + mm.CategoricalOutput; "de":
    DistributedEmbeddings + this package's output), ``strategy``, ``row`` (row-slice
    threshold), ``vocab_parallel`` (None / True / False), ``chunk_rows``, ``plain`` (the
    block's table handle given to Merlin's own ``mm.CategoricalOutput``), ``output``
    ("contrastive": ``mm.ContrastiveOutput`` with in-batch negatives, ``global`` (default
    True) from every rank's batch)."""
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)
    from merlin_models_de.outputs.tied import TiedCategoricalOutput

    s = schema()
    tf.keras.utils.set_random_seed(1)
    if spec.get("block") == "mm":
        block = mm.Embeddings(s, dim=DIM)
        to_call = block["item"]
        if spec.get("bias"):
            from merlin.models.tf.outputs.classification import EmbeddingTablePrediction

            to_call = EmbeddingTablePrediction(to_call, use_bias=True, bias_initializer="uniform")
        output = mm.CategoricalOutput(to_call=to_call, target=TARGET)
    else:
        block = mm.DistributedEmbeddings(
            s,
            dim=DIM,
            strategy=spec.get("strategy", "basic"),
            row_slice_threshold=spec.get("row"),
            backend="horovod",
        )
        if spec.get("output") == "contrastive":  # in-batch negatives, tied to the table
            from merlin_models_de.outputs.samplers import GlobalInBatchSampler

            sampler = GlobalInBatchSampler() if spec.get("global", True) else "in-batch"
            output = mm.ContrastiveOutput(
                to_call=block["item"], target=TARGET, negative_samplers=sampler
            )
        elif spec.get("plain"):  # Merlin's own output class, given the handle
            output = mm.CategoricalOutput(to_call=block["item"], target=TARGET)
        else:
            output = TiedCategoricalOutput(
                to_call=block["item"],
                target=TARGET,
                vocab_parallel=spec.get("vocab_parallel"),
                chunk_rows=spec.get("chunk_rows", 16),
                use_bias=spec.get("bias", False),
                bias_initializer="uniform",
            )
    model = mm.Model(mm.InputBlockV2(s, categorical=block), dense_layer(), output)
    return model, block


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    return {
        "user": rng.integers(0, USERS, rows),
        "prev_item": rng.integers(0, ITEMS, rows),
        TARGET: rng.integers(0, ITEMS, rows),
    }


def split_xy(data, rows=None):
    pick = slice(None) if rows is None else rows
    x = {k: v[pick].reshape(-1, 1) for k, v in data.items() if k != TARGET}
    return x, data[TARGET][pick].reshape(-1, 1)


def rank_rows(total, per_rank, world_size, rank):
    """Rows of ``rank``: its slice of every global batch, so rank batches concat to it."""
    batch = per_rank * world_size
    return np.concatenate(
        [
            np.arange(start + rank * per_rank, start + (rank + 1) * per_rank)
            for start in range(0, total, batch)
        ]
    )


def tables_of(block):
    """{table: full array}; collective for a DistributedEmbeddings block."""
    if hasattr(block, "get_global_weights"):
        return block.get_global_weights()
    return {name: t.table.embeddings.numpy() for name, t in block.parallel_dict.items()}


def set_tables(block, arrays):
    if hasattr(block, "set_global_weights"):
        block.set_global_weights(arrays)
    else:
        for name, table in block.parallel_dict.items():
            table.table.embeddings.assign(arrays[name])


def _blocks(model, block):
    """The item table's block, and the output's bias block where there is one."""
    from merlin_models_de.variables import embedding_blocks

    return embedding_blocks(model) if hasattr(block, "get_global_weights") else [block]


def snapshot(model, block):
    out = {f"table/{k}": v for b in _blocks(model, block) for k, v in tables_of(b).items()}
    merlin_bias = [w for w in model.weights if "output_layer_bias" in w.name]
    if merlin_bias:  # Merlin's EmbeddingTablePrediction: in the layout of this package's
        out["table/item_output_bias"] = merlin_bias[0].numpy().reshape(-1, 1)
    out.update(
        {f"dense/{i}": w for i, w in enumerate(model.get_layer("to_item_space").get_weights())}
    )
    return out


def restore(model, block, weights, prefix):
    for b in _blocks(model, block):
        names = {t.name for t in b.tables} if hasattr(b, "tables") else None
        set_tables(
            b,
            {
                k.split("/", 2)[2]: v
                for k, v in weights.items()
                if k.startswith(f"{prefix}/table/")
                and (names is None or k.split("/", 2)[2] in names)
            },
        )
    layer = model.get_layer("to_item_space")
    layer.set_weights([weights[f"{prefix}/dense/{i}"] for i in range(len(layer.weights))])


def optimizer(name, lr):
    legacy = tf.keras.optimizers.legacy
    return {"sgd": legacy.SGD, "adagrad": legacy.Adagrad}[name](lr)


def dataset(x, y, batch):
    """Batches in order, with an unknown static batch size (as a data loader gives them).

    (With NumPy arrays Keras gives a static batch size; the block's outputs on several ranks
    then mix static and unknown batch sizes, which Merlin's concatenation refuses.)
    """
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def train(model, x, y, batch, spec, lr):
    model.compile(optimizer=optimizer(spec["optimizer"], lr), run_eagerly=spec.get("eager", False))
    from tests.ranks.oracle_dlrm import LossRecorder

    losses = LossRecorder()
    model.fit(dataset(x, y, batch), epochs=1, verbose=0, callbacks=[losses])
    return losses.losses


def exact_top_k_metrics(logits, targets, k=10):
    """Merlin's default top-k metrics from the exact rank of each target (the number of items
    scoring strictly higher), as ``exact/<name>``. Merlin's own metrics add up to 1e-6 of
    random noise to every score to break ties, which reorders items closer than that."""
    rank = (logits > logits[np.arange(len(targets)), targets][:, None]).sum(axis=1)
    hit = (rank < k).astype(np.float64)
    return {
        "exact/recall_at_10": hit.mean(),
        "exact/mrr_at_10": (hit / (rank + 1)).mean(),
        "exact/ndcg_at_10": (hit / np.log2(rank + 2)).mean(),
        "exact/map_at_10": (hit / (rank + 1)).mean(),
        "exact/precision_at_10": (hit / k).mean(),
    }


def top_k_outputs(model, x, y, batch, k=10):
    """``top_k/scores``, ``top_k/ids`` and ``top_k/<metric>`` of
    :func:`merlin_models_de.outputs.topk.top_k_model` (collective on a sharded table)."""
    from merlin_models_de.outputs.topk import top_k_model

    topk = top_k_model(model, k=k)
    scores, ids = topk.predict(dataset(x, y, batch), verbose=0)
    topk.compile()
    metrics = topk.evaluate(dataset(x, y, batch), verbose=0, return_dict=True)
    return {
        "top_k/scores": scores,
        "top_k/ids": ids,
        **{f"top_k/{name}": value for name, value in metrics.items()},
    }


def main(src, dst):
    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    model, block = build_model(
        dict(spec, block="de", strategy="basic", row=None, vocab_parallel=False)
    )
    x, y = split_xy(data)
    model({k: tf.constant(v[:2]) for k, v in x.items()})
    initial = snapshot(model, block)
    n = spec["world_size"]
    losses = train(model, x, y, spec["per_rank"] * n, spec, spec["lr"] * n)
    evaluation = model.evaluate(dataset(x, y, spec["per_rank"] * n), verbose=0, return_dict=True)
    logits = model.predict(dataset(x, y, spec["per_rank"] * n), verbose=0)
    evaluation.update(exact_top_k_metrics(logits, y.reshape(-1)))
    top_k = top_k_outputs(model, x, y, spec["per_rank"] * n)
    out = {f"initial/{k}": v for k, v in initial.items()}
    out.update({f"final/{k}": v for k, v in snapshot(model, block).items()})
    np.savez(
        dst,
        losses=np.array(losses),
        evaluation_loss=evaluation["loss"],
        predictions=logits,
        **top_k,
        evaluation=json.dumps({k: float(v) for k, v in evaluation.items()}),
        **out,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
