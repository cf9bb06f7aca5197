"""Merlin's transformer next-item example (XLNet, ``SequenceMaskRandom``,
``mm.CategoricalOutput(to_call=...)``, compiled with ``loss="categorical_crossentropy"`` and
``mm.TopKMetricsAggregator.default_metrics(top_ks=[10])``) over a ``DistributedEmbeddings``
item table, for tests/ranks/test_next_item_compile.py and its one-process reference.

Usage (the reference): python -m tests.ranks.transformer_example IN.npz OUT.npz

For an exact oracle two sources of randomness are fixed where the test asks for it
(``spec["fixed"]``): XLNet's dropout is 0 and the masked positions are chosen by position
(:class:`FixedMask`, a ``SequenceMaskRandom`` with its random draw replaced), so one process
on the global batch masks the same targets as N ranks on theirs. The masked embedding XLNet's
masking adds is created by the first training step: a step at learning rate 0 builds every
weight before the initial weights are taken.
"""

import json
import sys

import numpy as np
import tensorflow as tf

ITEMS, MAX_LEN, DIM = 60, 6, 16
ITEM = "item_id-list"


def schema():
    from merlin.schema import ColumnSchema, Schema, Tags

    return Schema(
        [
            ColumnSchema(
                ITEM,
                tags=[Tags.CATEGORICAL, Tags.ITEM, Tags.ID, Tags.SEQUENCE],
                dtype=np.int64,
                is_list=True,
                is_ragged=True,
                properties={
                    "domain": {"min": 0, "max": ITEMS - 1, "name": ITEM},
                    "value_count": {"min": 2, "max": MAX_LEN},
                },
            )
        ]
    )


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, MAX_LEN + 1, rows)  # SequenceMaskRandom needs 2 items or more
    return {"values": rng.integers(1, ITEMS, lengths.sum()), "lengths": lengths}


def take_rows(data, rows):
    seq = tf.RaggedTensor.from_row_lengths(data["values"], data["lengths"])
    picked = tf.gather(seq, rows)
    return {"values": picked.flat_values.numpy(), "lengths": picked.row_lengths().numpy()}


def batches(data, batch):
    """Batches as Merlin's Loader gives a ragged column: ``<name>__values`` / ``__offsets``."""
    seq = tf.RaggedTensor.from_row_lengths(data["values"], data["lengths"])

    def loader_form(seq):
        return {f"{ITEM}__values": seq.flat_values, f"{ITEM}__offsets": seq.row_splits}

    return tf.data.Dataset.from_tensor_slices(seq).batch(batch).map(loader_form)


def fixed_mask_class():
    import merlin.models.tf as mm

    class FixedMask(mm.SequenceMaskRandom):
        """``SequenceMaskRandom`` masking every second position (at least one, never all,
        the same for a sequence in any batch)."""

        def _generate_target_mask(self, ids_seq):
            positions = tf.ragged.range(ids_seq.row_lengths(1))
            return tf.equal(positions % 2, 1)

    return FixedMask


def build_model(spec):
    """The example's model with the block as its embeddings: ``(model, xlnet block)``."""
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    tf.keras.utils.set_random_seed(3)
    block = mm.DistributedEmbeddings(
        schema(),
        dim=DIM,
        sequence_combiner=None,
        strategy="basic",
        row_slice_threshold=spec.get("row"),
        backend="horovod",
    )
    input_block = mm.InputBlockV2(schema(), categorical=block)
    xlnet_block = mm.XLNetBlock(
        d_model=DIM, n_head=2, n_layer=2, **({"dropout": 0.0} if spec["fixed"] else {})
    )
    mlp_block = mm.MLPBlock([32, DIM], no_activation_last_layer=True)
    output_block = mm.CategoricalOutput(to_call=block[ITEM])
    return mm.Model(input_block, mlp_block, xlnet_block, output_block), xlnet_block


def masks(spec, xlnet_block):
    """``(train pre, evaluate pre)``: the example's ``SequenceMaskRandom`` (or the fixed
    mask) and ``SequenceMaskLast``."""
    import merlin.models.tf as mm

    cls = fixed_mask_class() if spec["fixed"] else mm.SequenceMaskRandom
    train = cls(schema=schema(), target=ITEM, masking_prob=0.3, transformer=xlnet_block)
    last = mm.SequenceMaskLast(schema=schema(), target=ITEM, transformer=xlnet_block)
    return train, last


def compile_as_the_example(model, lr):
    import merlin.models.tf as mm

    model.compile(
        run_eagerly=False,
        optimizer=tf.keras.optimizers.legacy.Adam(learning_rate=lr),
        loss="categorical_crossentropy",
        metrics=mm.TopKMetricsAggregator.default_metrics(top_ks=[10]),
    )


def build_every_weight(model, data, batch, pre):
    """One training step at learning rate 0: XLNet's masking creates its weights then."""
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.0))
    model.fit(batches(data, batch).take(1), epochs=1, verbose=0, pre=pre)


class StepLosses(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss_batch"]))


def main(src, dst):
    from tests.ranks import oracle_dlrm as fc

    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    batch = spec["per_rank"] * spec["world_size"]
    model, xlnet_block = build_model(dict(spec, row=None))
    train_pre, last = masks(spec, xlnet_block)
    build_every_weight(model, data, batch, train_pre)
    initial = fc.snapshot(model)
    compile_as_the_example(model, spec["lr"] * spec["world_size"])
    steps = StepLosses()
    history = model.fit(batches(data, batch), epochs=1, verbose=0, callbacks=[steps], pre=train_pre)
    evaluation = model.evaluate(batches(data, batch), verbose=0, return_dict=True, pre=last)
    out = {f"initial/{k}": v for k, v in initial.items()}
    out.update({f"final/{k}": v for k, v in fc.snapshot(model).items()})
    np.savez(
        dst,
        losses=np.array(steps.losses),
        history=json.dumps({k: [float(v) for v in vs] for k, vs in history.history.items()}),
        evaluation=json.dumps({k: float(v) for k, v in evaluation.items()}),
        **out,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
