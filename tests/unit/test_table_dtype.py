"""16-bit tables in one process: stochastic rounding, RowWiseAdagrad on 16-bit rows, the block's
``table_dtype`` (storage, lookups, refusals) and what persists it (checkpoints, table exports,
SavedModels)."""

import json
import os

import merlin.models.tf as mm
import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, RowWiseAdagrad, export_table
from merlin_models_de.kernels.rounding import random_bits, stochastic_round
from merlin_models_de.kernels.rowwise.adagrad import ROW_SLOT
from merlin_models_de.persistence.checkpoint import latest_checkpoint, save_checkpoint
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.persistence.restore import restore_checkpoint
from merlin_models_de.persistence.table_export import read_table
from merlin_models_de.tables import table_dtype_name
from merlin_models_de.variables import TableMark, embedding_blocks, mark_table, slots_of
from tests.rowwise_reference import NumpyRowWiseAdagrad
from tests.unit.test_layer_arguments import batch, schema

NARROW = ["bfloat16", "float16"]


MANTISSA_BITS = {"bfloat16": 7, "float16": 10}


@pytest.mark.parametrize("dtype", NARROW)
def test_stochastic_rounding_picks_a_neighbour_without_bias(dtype):
    x = tf.constant(np.random.default_rng(0).normal(size=(500, 8)).astype(np.float32))
    bits = random_bits(tf.range(500, dtype=tf.int64), 0, 8, 8, 3, "t")
    rounded = tf.cast(stochastic_round(x, dtype, bits), tf.float32).numpy()
    nearest = tf.cast(tf.cast(x, dtype), tf.float32).numpy()
    # one of the two 16-bit numbers around x: a 16-bit number less than a 16-bit step away
    assert (tf.cast(tf.cast(rounded, dtype), tf.float32).numpy() == rounded).all()
    spacing = 2.0 ** (np.floor(np.log2(np.abs(x.numpy()))) - MANTISSA_BITS[dtype])
    assert (np.abs(rounded - x.numpy()) < spacing).all()
    assert 0.2 < np.mean(rounded != nearest) < 0.8  # not round-to-nearest
    exact = tf.cast(tf.constant([[0.5, -2.0, 0.0, 1.0]]), dtype)
    kept = stochastic_round(tf.cast(exact, tf.float32), dtype, tf.fill([1, 4], 2**32 - 1))
    assert kept.numpy().tolist() == exact.numpy().tolist()
    # small updates that round-to-nearest would lose add up in expectation
    rows = tf.range(20_000, dtype=tf.int64)
    value = tf.ones([20_000], dtype)
    for step in range(50):
        wider = tf.cast(value, tf.float32) + 1e-4
        value = stochastic_round(wider, dtype, random_bits(rows, 0, 1, 1, step, "t")[:, 0])
    assert float(tf.reduce_mean(tf.cast(value, tf.float32))) == pytest.approx(1.005, abs=2e-4)
    assert float(tf.cast(tf.cast(1.0 + 1e-4, dtype), tf.float32)) == 1.0


def test_random_bits_depend_on_the_element_only():
    """A row rounds the same whichever rank holds it: the bits of a shard's rows and
    columns are the whole table's, at the same places."""
    whole = random_bits(tf.range(10, dtype=tf.int64), 0, 8, 8, 5, "items").numpy()
    part = random_bits(tf.constant([7, 2], tf.int64), 4, 4, 8, 5, "items").numpy()
    np.testing.assert_array_equal(part, whole[[7, 2], 4:])
    assert not np.array_equal(whole, random_bits(tf.range(10), 0, 8, 8, 6, "items").numpy())
    assert not np.array_equal(whole, random_bits(tf.range(10), 0, 8, 8, 5, "users").numpy())
    assert 0.4 < whole.mean() / 2**32 < 0.6 and whole.min() >= 0 and whole.max() < 2**32


@pytest.mark.parametrize("dtype", NARROW)
def test_rowwise_adagrad_on_16_bit_rows_follows_the_float32_reference(dtype):
    rng = np.random.default_rng(1)
    start = rng.normal(size=(9, 4)).astype(np.float32)
    var = tf.Variable(tf.cast(start, dtype))
    mark_table(var, TableMark("t", 4, 4))
    ref_var = tf.Variable(tf.cast(var, tf.float32))
    ref = NumpyRowWiseAdagrad(0.1, 0.1, 1e-7, is_table=lambda v: v.shape.rank == 2)
    opt = RowWiseAdagrad(0.1)
    for k in range(20):
        ids = rng.integers(0, 9, size=6)
        values = rng.normal(size=(6, 4)).astype(np.float32)
        grad = tf.IndexedSlices(tf.constant(values), tf.constant(ids), tf.constant([9, 4]))
        narrow = tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices, grad.dense_shape)
        opt.apply_gradients([(narrow if k % 2 else grad, var)])
        ref.apply_gradients(
            [
                (
                    tf.IndexedSlices(
                        tf.cast(narrow.values, tf.float32), grad.indices, grad.dense_shape
                    )
                    if k % 2
                    else grad,
                    ref_var,
                )
            ]
        )
    assert var.dtype == dtype
    acc = slots_of(opt, var)[ROW_SLOT]
    assert acc.dtype == tf.float32 and acc.shape == (9, 1)
    np.testing.assert_allclose(acc.numpy(), ref.accumulator(ref_var), rtol=1e-5)
    # each step rounds once, within a 16-bit step of the float32 path (rows are ~1 in size)
    ulp = 2.0**-7 if dtype == "bfloat16" else 2.0**-10
    got = tf.cast(var, tf.float32).numpy()
    np.testing.assert_allclose(got, ref_var.numpy(), atol=20 * ulp * 2)
    assert not np.array_equal(got, np.asarray(tf.cast(tf.cast(start, dtype), tf.float32)))


def test_table_dtype_option_is_checked_and_kept():
    assert table_dtype_name(tf.bfloat16) == "bfloat16" and table_dtype_name(None) is None
    with pytest.raises(ValueError, match="table_dtype='int8'"):
        DistributedEmbeddings(schema(), dim=4, table_dtype="int8")
    block = DistributedEmbeddings(schema(), dim=4, table_dtype="bfloat16")
    out = block(batch())
    assert {t.dtype for t in out.values()} == {tf.float32}
    assert {v.dtype for v in block.weights if v.shape.rank == 2} == {tf.bfloat16}
    again = DistributedEmbeddings.from_config(json.loads(json.dumps(block.get_config())))
    assert again.table_dtype == "bfloat16"
    tables = block.get_global_weights()
    assert {str(t.dtype) for t in tables.values()} == {"bfloat16"}
    again(batch())
    again.set_global_weights({k: np.asarray(v, np.float32) for k, v in tables.items()})
    for name, value in again(batch()).items():
        np.testing.assert_array_equal(value.numpy(), out[name].numpy())


def test_distributed_embeddings_backend_refuses_16_bit_tables():
    from merlin_models_de.backends.distributed_embeddings import DistributedEmbeddingsBackend

    problem = DistributedEmbeddingsBackend.unsupported((), None, "float16")
    assert "table_dtype='float16'" in problem and "backend='horovod'" in problem


def model(table_dtype="bfloat16"):
    tf.keras.utils.set_random_seed(2)
    block = DistributedEmbeddings(schema(), dim=4, table_dtype=table_dtype)
    inputs = mm.InputBlockV2(schema(), categorical=block, aggregation="concat")
    return mm.Model(inputs, mm.MLPBlock([4]), mm.BinaryClassificationTask("user"))


def data(rows=64):
    rng = np.random.default_rng(5)
    x = {
        "user": rng.integers(0, 2, size=(rows, 1)),
        "item": rng.integers(0, 30, size=(rows, 1)),
        "tags": rng.integers(0, 10, size=(rows, 2)),
        "liked": rng.integers(0, 10, size=(rows, 3)),
    }
    return x, x["user"].astype(np.float32)


def test_keras_optimizers_are_refused_naming_the_table():
    m = model()
    with pytest.raises(ValueError, match=r"Table '.*' of block .*bfloat16.*optimizer=Adagrad"):
        m.compile(optimizer=tf.keras.optimizers.legacy.Adagrad(0.1))
    m.compile(optimizer=RowWiseAdagrad(0.1))  # the retry with the right optimizer works
    multi = mm.MultiOptimizer(
        default_optimizer=tf.keras.optimizers.legacy.Adam(0.01),
        optimizers_and_blocks=[mm.OptimizerBlocks(RowWiseAdagrad(0.1), m.blocks[0])],
    )
    m.compile(optimizer=multi)


def test_a_refused_compile_leaves_the_model_as_it_was():
    """The optimizer is checked as given, before Merlin or Keras compile: a name, an
    optimizer, a MultiOptimizer whose default would train the block."""
    m = model()
    table = r"Table '\w+' of block '\w+' is stored in bfloat16 \(table_dtype='bfloat16'\)"
    multi = mm.MultiOptimizer(
        default_optimizer=tf.keras.optimizers.legacy.Adam(0.01),
        optimizers_and_blocks=[mm.OptimizerBlocks(RowWiseAdagrad(0.1), m.blocks[1])],
    )
    refused = [("sgd", "SGD"), (tf.keras.optimizers.legacy.Adagrad(0.1), "Adagrad")]
    refused.append((multi, "Adam"))
    for optimizer, name in refused:
        with pytest.raises(ValueError, match=table + rf".*Received: optimizer={name}$"):
            m.compile(optimizer=optimizer)
        assert m.optimizer is None and m.compiled_loss is None  # never compiled
    rowwise = RowWiseAdagrad(0.1)
    m.compile(optimizer=rowwise)
    loss = m.compiled_loss
    for optimizer, _ in refused:
        with pytest.raises(ValueError, match=table):
            m.compile(optimizer)
        assert m.optimizer is rowwise and m.compiled_loss is loss  # the last compile stands
    x, y = data()
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)  # and trains with it


class PlainRanker(tf.keras.Model):
    """A plain Keras model around the block: no Merlin compile in front of Keras'."""

    def __init__(self, table_dtype="bfloat16"):
        super().__init__()
        self.embeddings = DistributedEmbeddings(schema(), dim=4, table_dtype=table_dtype)
        self.head = tf.keras.layers.Dense(1)

    def call(self, features):
        rows = self.embeddings(features)
        return self.head(tf.concat([rows[name] for name in sorted(rows)], axis=1))


def test_a_plain_keras_model_refuses_the_same_optimizers_before_compiling():
    table = r"Table '\w+' of block '\w+' is stored in bfloat16 \(table_dtype='bfloat16'\)"
    m = PlainRanker()
    for optimizer, name in [("adam", "Adam"), (tf.keras.optimizers.legacy.SGD(0.1), "SGD")]:
        with pytest.raises(ValueError, match=table + rf".*Received: optimizer={name}$"):
            m.compile(optimizer=optimizer, loss="mse")
        assert m.optimizer is None and m.compiled_loss is None  # never compiled
    m.compile(optimizer=RowWiseAdagrad(0.1), loss="mse")
    x, y = data()
    m({k: tf.constant(v) for k, v in x.items()})  # built, so the tables can be read
    tables = [w for w in m.embeddings.trainable_weights if w.dtype == tf.bfloat16]
    before = [w.numpy().copy() for w in tables]
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert tables and all(w.dtype == tf.bfloat16 for w in tables)
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, tables))  # trained
    # float32 tables, and models without the block, compile with any optimizer
    PlainRanker(table_dtype=None).compile(optimizer="adam", loss="mse")
    dense = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    dense.compile(optimizer="sgd", loss="mse")
    assert dense.optimizer is not None


def test_a_custom_loop_refuses_other_optimizers_on_16_bit_tables():
    """A loop that applies gradients itself (no compile): Keras' optimizers, new-style and
    legacy, refuse the 16-bit shards before updating anything, in a tf.function as eagerly;
    RowWiseAdagrad trains them, and other optimizers still train float32 tables."""
    x, y = data()
    features = {k: tf.constant(v) for k, v in x.items()}
    target = tf.constant(y, tf.float32)

    def step(m, optimizer):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((m(features) - target) ** 2)
        variables = m.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    m = PlainRanker()
    m(features)
    tables = [w for w in m.trainable_weights if w.dtype == tf.bfloat16]
    before = [w.numpy().copy() for w in tables + m.head.trainable_weights]
    shard = r"Variable '[\w/]+mp_\w+:0' is a table shard stored in bfloat16; .*"
    for optimizer, name in [
        (tf.keras.optimizers.Adam(0.1), "Adam"),
        (tf.keras.optimizers.legacy.SGD(0.1), "SGD"),
    ]:
        for run in (step, tf.function(step)):
            with pytest.raises(ValueError, match=shard + rf"Received: optimizer={name}$"):
                run(m, optimizer)
    after = [w.numpy() for w in tables + m.head.trainable_weights]
    assert all(np.array_equal(b, a) for b, a in zip(before, after))  # nothing updated
    tf.function(step)(m, RowWiseAdagrad(0.1))
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, tables))
    wide = PlainRanker(table_dtype=None)
    wide(features)
    tf.function(step)(wide, tf.keras.optimizers.Adam(0.1))  # float32 tables: any optimizer


@pytest.mark.full  # ~43 s; the CI tier writes and reads 16-bit checkpoints in test_checkpoint_damage
def test_trained_16_bit_tables_persist_in_16_bits(tmp_path):
    x, y = data()
    m = model()
    m.compile(optimizer=RowWiseAdagrad(0.1))
    m.fit(x, y, batch_size=16, epochs=2, verbose=0)
    before = m.predict(x, batch_size=64, verbose=0)
    save_checkpoint(m, str(tmp_path / "ckpt"))
    manifest = json.load(
        open(os.path.join(latest_checkpoint(str(tmp_path / "ckpt")), "manifest.json"))
    )
    dtypes = {
        p["name"]: p["dtype"] for b in manifest["blocks"] for t in b["tables"] for p in t["parts"]
    }
    assert dtypes == {"table": "bfloat16", ROW_SLOT: "float32"}
    again = model()
    again.compile(optimizer=RowWiseAdagrad(0.1))
    again(dict((k, v[:2]) for k, v in x.items()))
    restore_checkpoint(again, str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(again.predict(x, batch_size=64, verbose=0), before)
    wide = model(table_dtype=None)
    wide.compile(optimizer=RowWiseAdagrad(0.1))
    wide(dict((k, v[:2]) for k, v in x.items()))
    with pytest.raises(StorageError, match=r"as bfloat16, the model as float32"):
        restore_checkpoint(wide, str(tmp_path / "ckpt"))
    (block,) = embedding_blocks(m)
    export_table(block, "item", str(tmp_path / "items"))
    exported = read_table(str(tmp_path / "items"))
    assert str(exported.dtype) == "bfloat16"
    assert os.path.getsize(tmp_path / "items" / "part-00000.npy") < 128 + 30 * 4 * 2 + 64
    np.testing.assert_array_equal(
        np.asarray(exported, np.float32), np.asarray(block.get_global_weights()["item"], np.float32)
    )
    m.save(str(tmp_path / "saved"))
    loaded = tf.keras.models.load_model(str(tmp_path / "saved"))
    np.testing.assert_allclose(loaded.predict(x, batch_size=64, verbose=0), before, atol=1e-6)
