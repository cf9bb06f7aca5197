"""A session model for the fit oracle: a GRU over un-pooled item sequences from the block.

Shared by the 2-rank test (test_session_fit.py) and its single-process reference run
(fit_reference.py with ``spec["model"] == "session"``). Data live in plain NumPy arrays (a
ragged column as ``<name>__values`` + ``<name>__lengths``) so they travel in .npz; the model
is fed what Merlin's Loader yields (``item_seq__values`` / ``item_seq__offsets``).
"""

import json

import numpy as np
import tensorflow as tf

ITEMS, USERS, MAX_LEN = 300, 40, 6


def schema():
    """A ragged item-id sequence, a one-hot user id and a binary label."""
    from merlin.schema import ColumnSchema, Schema, Tags

    def cat(name, rows, tags=(), value_count=None, **kwargs):
        properties = {"domain": {"min": 0, "max": rows - 1, "name": name}}
        if value_count is not None:
            properties["value_count"] = value_count
        return ColumnSchema(
            name, tags=[Tags.CATEGORICAL, *tags], dtype=np.int64, properties=properties, **kwargs
        )

    return Schema(
        [
            cat(
                "item_seq",
                ITEMS,
                (Tags.ITEM, Tags.ID, Tags.SEQUENCE),
                is_list=True,
                is_ragged=True,
                value_count={"min": 1, "max": MAX_LEN},
            ),
            cat("user", USERS, (Tags.USER, Tags.ID)),
            ColumnSchema("label", tags=[Tags.BINARY_CLASSIFICATION, Tags.TARGET], dtype=np.int64),
        ]
    )


class SessionEncoder(tf.keras.layers.Layer):
    """``{item_seq: [B, None, d] ragged, user: [B, d]}`` -> last GRU state ++ user vector.

    Keras' GRU takes the ragged sequences as they are (it masks by the row lengths), so the
    un-pooled outputs of the block go straight in.
    """

    def __init__(self, units=8, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.gru = tf.keras.layers.GRU(units)

    def call(self, inputs):
        return tf.concat([self.gru(inputs["item_seq"]), inputs["user"]], axis=1)

    def compute_output_shape(self, input_shapes):
        return tf.TensorShape([input_shapes["user"][0], self.units + input_shapes["user"][-1]])

    def get_config(self):
        return dict(super().get_config(), units=self.units)


def build_model(spec):
    """``spec``: strategy, row / column slice thresholds (elements) of the block."""
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    inputs = schema().excluding_by_tag("target")
    tf.keras.utils.set_random_seed(1)
    block = mm.DistributedEmbeddings(
        inputs,
        dim=8,
        sequence_combiner=None,
        strategy=spec["strategy"],
        row_slice_threshold=spec.get("row"),
        column_slice_threshold=spec.get("column"),
        backend="horovod",
    )
    # An input block (as a Merlin user writes it): it gives the model its schema, so Merlin
    # turns the loader's __values / __offsets into ragged features. aggregation=None keeps
    # the 3-D sequence and the 2-D user vector apart for the encoder.
    return mm.Model(
        mm.InputBlockV2(inputs, categorical=block, aggregation=None),
        SessionEncoder(8),
        mm.MLPBlock([8]),
        mm.BinaryOutput("label"),
    )


def build_next_item_model(spec):
    """Next-item prediction: item sequences (un-pooled) -> an MLP per position -> Merlin's
    ``mm.CategoricalOutput`` tied to the block's item table (trained with
    ``SequencePredictNext``: each position predicts the next item). ``spec``: strategy, row
    and column slice thresholds of the block."""
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    inputs = schema().select_by_name(["item_seq"])
    tf.keras.utils.set_random_seed(1)
    block = mm.DistributedEmbeddings(
        inputs,
        dim=8,
        sequence_combiner=None,
        strategy=spec["strategy"],
        row_slice_threshold=spec.get("row"),
        column_slice_threshold=spec.get("column"),
        backend="horovod",
    )
    return mm.Model(
        mm.InputBlockV2(inputs, categorical=block),
        mm.MLPBlock([8]),
        mm.CategoricalOutput(to_call=block["item_seq"]),
    )


def next_item_pre():
    import merlin.models.tf as mm

    return mm.SequencePredictNext(schema=schema().select_by_name(["item_seq"]), target="item_seq")


def sequences(data, batch):
    """Item sequences only, as Merlin's Loader gives them (the targets come from ``pre``)."""
    return dataset(data, batch).map(lambda x, y: {k: v for k, v in x.items() if "item" in k})


def next_item_reference(spec, data, dst):
    """fit_reference's single-process run of the next-item model on the global batches."""
    from tests.ranks import oracle_dlrm as fc

    batch = spec["per_rank"] * spec["world_size"]
    model = build_next_item_model(spec)
    model(next(iter(sequences(data, 2))))
    initial = fc.snapshot(model)
    model.compile(
        optimizer=fc.optimizer(spec["optimizer"], spec["lr"] * spec["world_size"]),
        run_eagerly=spec.get("eager", False),
    )
    losses = fc.LossRecorder()
    model.fit(sequences(data, batch), epochs=1, verbose=0, callbacks=[losses], pre=next_item_pre())
    final = fc.snapshot(model)
    evaluation = model.evaluate(
        sequences(data, batch), verbose=0, return_dict=True, pre=next_item_pre()
    )
    out = {f"initial/{k}": v for k, v in initial.items()}
    out.update({f"final/{k}": v for k, v in final.items()})
    np.savez(dst, losses=np.array(losses.losses), evaluation_loss=evaluation["loss"], **out)


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, MAX_LEN + 1, rows)
    return {
        "item_seq__values": rng.integers(0, ITEMS, lengths.sum()),
        "item_seq__lengths": lengths,
        "user": rng.integers(0, USERS, rows),
        "label": rng.integers(0, 2, rows),
    }


def take_rows(data, rows):
    """The samples ``rows`` of ``data`` (ragged columns too), as arrays."""
    seq = tf.RaggedTensor.from_row_lengths(data["item_seq__values"], data["item_seq__lengths"])
    picked = tf.gather(seq, rows)
    return {
        "item_seq__values": picked.flat_values.numpy(),
        "item_seq__lengths": picked.row_lengths().numpy(),
        "user": data["user"][rows],
        "label": data["label"][rows],
    }


def dataset(data, batch):
    """(x, y) batches in order, as Merlin's Loader gives them: item sequences as
    ``item_seq__values`` / ``item_seq__offsets``, users as [B, 1]."""
    x = {
        "item_seq": tf.RaggedTensor.from_row_lengths(
            data["item_seq__values"], data["item_seq__lengths"]
        ),
        "user": tf.constant(data["user"].reshape(-1, 1)),
    }
    y = tf.constant(data["label"].reshape(-1, 1).astype(np.float32))

    def loader_form(x, y):
        seq = x["item_seq"]
        return {
            "item_seq__values": seq.flat_values,
            "item_seq__offsets": seq.row_splits,
            "user": x["user"],
        }, y

    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(loader_form)


def reference(spec, data, dst):
    """fit_reference's single-process run of this model on the global batches (lr * N)."""
    from tests.ranks import oracle_dlrm as fc

    batch = spec["per_rank"] * spec["world_size"]
    model = build_model(spec)
    model(next(iter(dataset(data, 2)))[0])
    initial = fc.snapshot(model)
    before = model.predict(dataset(data, batch), verbose=0)
    model.compile(
        optimizer=fc.optimizer(spec["optimizer"], spec["lr"] * spec["world_size"]),
        run_eagerly=False,
    )
    losses = fc.LossRecorder()
    model.fit(dataset(data, batch), epochs=1, verbose=0, callbacks=[losses])
    final = fc.snapshot(model)
    evaluation = model.evaluate(dataset(data, batch), verbose=0, return_dict=True)
    predictions = model.predict(dataset(data, batch), verbose=0)
    out = {f"initial/{k}": v for k, v in initial.items()}
    out.update({f"final/{k}": v for k, v in final.items()})
    np.savez(
        dst,
        losses=np.array(losses.losses),
        predictions=np.asarray(predictions),
        predictions_before=np.asarray(before),
        evaluation=json.dumps({k: float(v) for k, v in evaluation.items()}),
        **out,
    )
