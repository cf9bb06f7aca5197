"""mm.Embeddings' regularization, freezing and Keras-layer combiners on N ranks, against one
process on the global batch (docs/design.md's oracle), under horovodrun -np 2.

Each case checks, for N ranks with batch B against one process with batch N*B: the first
forward outputs, the total loss of every step (main loss + the block's losses, averaged over
ranks: what Keras / Merlin report) and the full tables after a few SGD or Adagrad steps. The
reference computes the regularization itself from its full tables and outputs, so a wrong
per-rank factor (N x the batch term, N x a shard's regularizer) shows in losses and tables.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.planner import ShardingType
from merlin_models_de.variables import embedding_blocks
from tests.ranks import oracle
from tests.ranks.test_oracle import PLACEMENTS

OPTIONS = {name: (options, kinds) for name, options, kinds in PLACEMENTS}
# one placement per sharding kind (each also holds table-wise tables but "column")
KINDS = {
    "table-wise": "basic",
    "column-sliced": "basic-column",
    "row-sliced": "row-sliced",
    "data-parallel": "data-parallel",
}
EVERYTHING = "everything"  # row-, column-sliced and data-parallel tables in one plan


def make_block(placement, combiners=oracle.COMBINERS, **kwargs):
    """``placement``: a name of test_oracle's PLACEMENTS, or ``(options, kinds)``."""
    options, kinds = OPTIONS[placement] if isinstance(placement, str) else placement
    block = DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        sequence_combiner=combiners,
        backend="horovod",
        **options,
        **kwargs,
    )
    present = {s.kind for s in block.plan.shards}
    assert kinds <= present, (kinds, present)
    return block


def table_regularization(regs):
    """``{table: regularizer}`` -> reference loss: each regularizer of its full table."""
    return lambda variables, outputs: tf.add_n([reg(variables[t]) for t, reg in regs.items()])


def batch_regularization(factors):
    """``{feature: factor}`` -> reference loss: ``factor * sum(out ** 2)`` on the global batch."""

    def loss(variables, outputs):
        terms = []
        for name, factor in factors.items():
            out = outputs[name]
            out = out.flat_values if isinstance(out, tf.RaggedTensor) else out
            terms.append(factor * tf.reduce_sum(tf.square(out)))
        return tf.add_n(terms)

    return loss


def both(*losses):
    return lambda variables, outputs: tf.add_n([f(variables, outputs) for f in losses])


# ---- embeddings_regularizer -----------------------------------------------------------------

REGULARIZERS = {
    "l2": lambda: tf.keras.regularizers.L2(0.002),
    "l1l2": lambda: tf.keras.regularizers.L1L2(l1=0.001, l2=0.002),
}


@pytest.mark.parametrize("optimizer, regularizer", [("sgd", "l2"), ("adagrad", "l1l2")])
@pytest.mark.parametrize("kind", list(KINDS))
def test_embeddings_regularizer_matches_the_oracle(hvd, kind, optimizer, regularizer):
    block = make_block(KINDS[kind], embeddings_regularizer=REGULARIZERS[regularizer]())
    reference = {t.name: REGULARIZERS[regularizer]() for t in block.tables}
    oracle.assert_matches_oracle(
        block,
        optimizer,
        seed=sum(map(ord, kind + regularizer)),
        extra_loss=table_regularization(reference),
    )


def test_embeddings_regularizer_dict_in_graph_mode_matches_the_oracle(hvd):
    """A dict by feature / table name (a shared table reads its first feature), traced."""
    l2, l1l2 = tf.keras.regularizers.L2(0.01), tf.keras.regularizers.L1L2(0.002, 0.004)
    block = make_block(
        EVERYTHING,
        embeddings_regularizer={
            "user": l2,
            "item": l1l2,
            "genres": l2,
            "device": l1l2,
            "hist": "l2",
        },
    )
    kinds = {s.table: s.kind for s in block.plan.shards}
    assert (kinds["user"], kinds["item"], kinds["device"]) == (
        ShardingType.ROW_WISE,
        ShardingType.COLUMN_WISE,
        ShardingType.DATA_PARALLEL,
    )
    reference = {
        "user": l2,
        "item": l1l2,
        "genre": l2,
        "device": l1l2,
        "hist": tf.keras.regularizers.L2(),
    }  # "l2": Keras' default 0.01
    oracle.assert_matches_oracle(
        block, "adagrad", seed=21, extra_loss=table_regularization(reference), graph=True
    )


# ---- l2_batch_regularization_factor -----------------------------------------------------------


def test_l2_batch_regularization_factor_matches_the_oracle(hvd):
    """One float for every feature, pooled and un-pooled (ragged) outputs."""
    block = make_block(
        EVERYTHING, combiners=oracle.SEQUENCE_COMBINERS, l2_batch_regularization_factor=0.01
    )
    factors = {f.name: 0.01 for f in block.features}
    oracle.assert_matches_oracle(block, "sgd", seed=31, extra_loss=batch_regularization(factors))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_l2_batch_regularization_factor_by_feature_matches_the_oracle(hvd, graph):
    """A dict by feature: a shared table takes its first feature's factor for all its
    features; with a table regularizer on top."""
    block = make_block(
        EVERYTHING,
        l2_batch_regularization_factor={
            "user": 0.05,
            "item": 0.02,
            "genres": 0.03,
            "hist": 0.01,
            "device": 0.04,
        },
        embeddings_regularizer={"city": "l2"},
    )
    factors = {
        "user": 0.05,
        "item": 0.02,
        "genres": 0.03,
        "fav_genre": 0.03,
        "hist": 0.01,
        "device": 0.04,
    }
    loss = both(
        batch_regularization(factors), table_regularization({"city": tf.keras.regularizers.L2()})
    )
    oracle.assert_matches_oracle(block, "adagrad", seed=41, extra_loss=loss, graph=graph)


# ---- trainable ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "feature, table, kind",
    [
        ("user", "user", ShardingType.ROW_WISE),
        ("item", "item", ShardingType.COLUMN_WISE),
        ("device", "device", ShardingType.DATA_PARALLEL),
        ("hist", "hist", ShardingType.TABLE_WISE),
    ],
)
def test_frozen_table_stays_at_its_initial_values(hvd, feature, table, kind):
    """``trainable={feature: False}``: that table (each kind of shard) never moves on any
    rank, even with a regularizer and a batch term on it; the others train as one process."""
    block = make_block(
        EVERYTHING,
        trainable={feature: False},
        embeddings_regularizer="l2",
        l2_batch_regularization_factor=0.01,
    )
    assert {s.kind for s in block.plan.shards_of(table)} == {kind}
    loss = both(
        table_regularization({t.name: tf.keras.regularizers.L2() for t in block.tables}),
        batch_regularization({f.name: 0.01 for f in block.features}),
    )
    oracle.assert_matches_oracle(
        block, "adagrad", seed=sum(map(ord, feature)), extra_loss=loss, frozen={table}
    )
    # The shard variables stay trainable=True (so the table can be unfrozen later); the
    # table's handle keeps them out of the block's trainable variables.
    mine = [
        block.backend.shard_variable(s)[0]
        for s in block.plan.shards_on(comm.rank())
        if s.table == table
    ]
    trainable = {id(v) for v in block.trainable_variables}
    assert not any(id(v) in trainable for v in mine), [v.name for v in mine]


# ---- a Keras layer as sequence_combiner ---------------------------------------------------

# list features on three kinds: tags column-sliced, hist row-sliced, genres table-wise
LIST_KINDS = {
    "tags": ShardingType.COLUMN_WISE,
    "hist": ShardingType.ROW_WISE,
    "genre": ShardingType.TABLE_WISE,
}
LIST_PLACEMENT = (
    dict(strategy="memory_balanced", row_slice_threshold=3000, column_slice_threshold=2000),
    set(LIST_KINDS.values()),
)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_keras_layer_combiner_matches_the_oracle(hvd, graph):
    """The layer gets the un-pooled [B, None, dim] rows of a column-sliced, a row-sliced and
    a table-wise list; the batch term applies to the layer's output (as mm.Embeddings)."""
    summed = tf.keras.layers.Lambda(lambda x: tf.reduce_sum(x, axis=1))
    scaled = tf.keras.layers.Lambda(lambda x: 0.5 * tf.reduce_sum(x, axis=1))
    layers = {"tags": summed, "genres": scaled, "hist": summed}
    block = make_block(
        LIST_PLACEMENT,
        combiners=layers,
        l2_batch_regularization_factor={"tags": 0.05, "hist": 0.08},
    )
    kinds = {s.table: s.kind for s in block.plan.shards}
    assert {t: kinds[t] for t in LIST_KINDS} == LIST_KINDS
    loss = batch_regularization({"tags": 0.05, "hist": 0.08})
    oracle.assert_matches_oracle(
        block, "sgd" if graph else "adagrad", seed=51, extra_loss=loss, layers=layers, graph=graph
    )


# ---- through Merlin's model.fit -----------------------------------------------------------

FIT_PER_RANK = 32


@pytest.mark.full  # the regularizers against the oracle: the tests above
def test_fit_with_regularization_matches_one_process(hvd, tmp_path_factory):
    """DLRM compile / fit / evaluate with both regularizers: Merlin's ``loss_batch`` (its loss
    plus ``model.losses``) per step, the trained weights and evaluate's loss equal one process
    (a subprocess at world size 1) on the global batches."""
    from tests.ranks import oracle_dlrm as fc
    from tests.ranks.test_fit import reference

    n, r = comm.size(), comm.rank()
    steps = 3
    spec = dict(
        optimizer="adagrad",
        lr=0.05,
        strategy="memory_balanced",
        column=4000,
        world_size=n,
        per_rank=FIT_PER_RANK,
        backend="horovod",
        block_options=dict(
            embeddings_regularizer="l2",
            data_parallel_threshold=200,
            l2_batch_regularization_factor=0.01,
        ),
    )
    data = comm.broadcast_object(fc.make_data(n * FIT_PER_RANK * steps, seed=5))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("ref")))

    model = fc.build_model(spec)
    block = embedding_blocks(model)[0]
    assert {ShardingType.DATA_PARALLEL, ShardingType.COLUMN_WISE, ShardingType.TABLE_WISE} <= {
        s.kind for s in block.plan.shards
    }
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), FIT_PER_RANK, n, r)
    x_mine, y_mine = {k: v[rows] for k, v in x.items()}, y[rows]
    model(fc.take(x_mine, 0, 2))
    fc.restore(model, ref, "initial")
    model.compile(optimizer=fc.optimizer("adagrad", spec["lr"]))
    losses, regularization = fc.LossRecorder(), fc.LossRecorder("regularization_loss")
    model.fit(
        x_mine,
        y_mine,
        batch_size=FIT_PER_RANK,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[losses, regularization],
    )

    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    # Merlin's regularization_loss (this rank's model.losses), averaged: a real share
    reg_per_step = np.mean(comm.allgather_object(regularization.losses), axis=0)
    assert np.all(reg_per_step > 0.2 * per_step), (reg_per_step, per_step)
    np.testing.assert_allclose(
        per_step,
        ref["losses"],
        rtol=1e-4,
        atol=1e-5,
        err_msg="loss_batch (loss + regularization) per step",
    )
    final = fc.snapshot(model)
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    evaluation = model.evaluate(
        x_mine, y_mine, batch_size=FIT_PER_RANK, verbose=0, return_dict=True
    )
    want = json.loads(str(ref["evaluation"]))
    assert evaluation["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-5)
