"""A session model for the oracle: a GRU over un-pooled item sequences from the block.

Shared by the 2-rank test and its single-process reference run. Data live in plain NumPy
arrays (a ragged column as ``<name>__values`` + ``<name>__lengths``) so they travel in .npz.
"""
import numpy as np
import tensorflow as tf

ITEMS, USERS, MAX_LEN = 300, 40, 6


def schema():
    from merlin.schema import ColumnSchema, Schema, Tags

    def cat(name, rows, tags=(), value_count=None, **kwargs):
        properties = {"domain": {"min": 0, "max": rows - 1, "name": name}}
        if value_count is not None:
            properties["value_count"] = value_count
        return ColumnSchema(name, tags=[Tags.CATEGORICAL, *tags], dtype=np.int64,
                            properties=properties, **kwargs)

    return Schema([
        cat("item_seq", ITEMS, (Tags.ITEM, Tags.ID, Tags.SEQUENCE), is_list=True,
            is_ragged=True, value_count={"min": 1, "max": MAX_LEN}),
        cat("user", USERS, (Tags.USER, Tags.ID)),
        ColumnSchema("label", tags=[Tags.BINARY_CLASSIFICATION, Tags.TARGET], dtype=np.int64),
    ])


class SessionEncoder(tf.keras.layers.Layer):
    """``{item_seq: [B, None, d], user: [B, d]}`` -> GRU state of the sequence ++ user."""

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
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    s = schema()
    tf.keras.utils.set_random_seed(1)
    inputs = s.excluding_by_tag("target")
    block = mm.DistributedEmbeddings(inputs, dim=8, sequence_combiner=None,
                                     strategy=spec["strategy"],
                                     row_slice_threshold=spec.get("row"),
                                     column_slice_threshold=spec.get("column"),
                                     backend="horovod")
    return mm.Model(block, SessionEncoder(8), mm.MLPBlock([8]), mm.BinaryOutput("label"))


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, MAX_LEN + 1, rows)
    return {"item_seq__values": rng.integers(0, ITEMS, lengths.sum()),
            "item_seq__lengths": lengths, "user": rng.integers(0, USERS, rows),
            "label": rng.integers(0, 2, rows)}


def take_rows(data, rows):
    """The samples ``rows`` of ``data`` (ragged columns too), as arrays."""
    seq = tf.RaggedTensor.from_row_lengths(data["item_seq__values"], data["item_seq__lengths"])
    picked = tf.gather(seq, rows)
    return {"item_seq__values": picked.flat_values.numpy(),
            "item_seq__lengths": picked.row_lengths().numpy(),
            "user": data["user"][rows], "label": data["label"][rows]}


def dataset(data, batch):
    """(x, y) batches in order, as Merlin's Loader gives them: item sequences as
    ``item_seq__values`` / ``item_seq__offsets``, users as [B, 1]."""
    x = {"item_seq": tf.RaggedTensor.from_row_lengths(data["item_seq__values"],
                                                      data["item_seq__lengths"]),
         "user": tf.constant(data["user"].reshape(-1, 1))}
    y = tf.constant(data["label"].reshape(-1, 1).astype(np.float32))

    def loader_form(x, y):
        seq = x["item_seq"]
        return {"item_seq__values": seq.flat_values, "item_seq__offsets": seq.row_splits,
                "user": x["user"]}, y

    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(loader_form)
