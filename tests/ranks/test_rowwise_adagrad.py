"""RowWiseAdagrad on 2 ranks: equal to one process with the global batch (the block against
the NumPy reference of tests/rowwise_reference.py; a Merlin model's fit against a plain
process), its state sharded with the tables, and in checkpoints one value per row."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm, export_table
from merlin_models_de.kernels.rowwise.adagrad import ROW_SLOT
from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError
from merlin_models_de.planner import ShardingType
from merlin_models_de.variables import embedding_blocks, slots_of
from tests.ranks import oracle
from tests.ranks import oracle_dlrm as fc
from tests.ranks.one_process import one_process_env
from tests.ranks.test_fit import PER_RANK, started_like_reference
from tests.ranks.test_oracle import PLACEMENTS, make_block

# test_oracle's placements with row-sliced, column-sliced and data-parallel tables, and how
# the step runs (eager through the tape; graph through the optimizer compile makes)
HOW = {
    "row-sliced": dict(),
    "basic-column": dict(graph=True, via_optimizer=True),
    "everything": dict(graph=True),
}
CASES = [p for p in PLACEMENTS if p[0] in HOW]
# a Merlin DLRM whose block holds a column-sliced table
SPEC = dict(
    optimizer="rowwise_adagrad", lr=0.05, strategy="memory_balanced", column=4000, per_rank=PER_RANK
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_block_matches_the_numpy_reference(hvd, case):
    """One-hot, pooled multi-hot (mean, sum, sqrtn) and un-pooled sequence features."""
    name, options, kinds = case
    block = make_block(**options)
    assert kinds <= {s.kind for s in block.plan.shards}
    oracle.assert_matches_oracle(block, "rowwise_adagrad", seed=sum(map(ord, name)), **HOW[name])


def test_the_reference_tells_row_wise_from_element_wise(hvd):
    """The oracle above can fail: element-wise Adagrad trains the same tables differently."""
    block = make_block(strategy="basic")
    tables = block.tables
    arrays = oracle.global_tables(tables, 1)
    batch = oracle.global_batch(block.features, tables, 32, 2)
    probes = oracle.make_probes(block.features, tables, 3)
    targets = np.random.default_rng(4).normal(size=32).astype(np.float32)
    args = (block, arrays, batch, 32)
    row = oracle.run_reference(*args, "rowwise_adagrad", 2, probes, targets)[2]
    element = oracle.run_reference(*args, "adagrad", 2, probes, targets)[2]
    assert not np.allclose(row["user"], element["user"], rtol=1e-3)


def _row_state_shapes(model):
    """This rank's ``{shard: (shard shape, row state shape)}``."""
    (block,) = embedding_blocks(model)
    out = {}
    for shard in block.plan.shards_on(block.rank):
        var, _ = block.backend.shard_variable(shard)
        out[shard.table] = (tuple(var.shape), tuple(slots_of(model.optimizer, var)[ROW_SLOT].shape))
    return out


def test_fit_matches_one_process(hvd, tmp_path_factory):
    """A Merlin DLRM compiled with RowWiseAdagrad: 2 ranks (a column-sliced table among the
    shards) train like one process on the global batch."""
    spec = dict(SPEC, world_size=comm.size(), backend="horovod")
    ref, model, _, x_mine, y_mine = started_like_reference(spec, tmp_path_factory, seed=13)
    (block,) = embedding_blocks(model)
    assert any(s.kind is ShardingType.COLUMN_WISE for s in block.plan.shards)
    model.compile(optimizer=fc.optimizer("rowwise_adagrad", spec["lr"]))
    model.fit(x_mine, y_mine, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    for table, (shape, state) in _row_state_shapes(model).items():
        assert state == (shape[0], 1), table
    final = fc.snapshot(model)
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    assert not np.allclose(final["table/C1"], ref["initial/table/C1"])  # it trained


@pytest.mark.full  # 35 s; the CI tier's 16-bit tables on 2 ranks: test_rowwise_storable.py
def test_fit_with_16_bit_tables_matches_one_process(hvd, tmp_path_factory):
    """Tables stored in bfloat16: 2 ranks train like one process on the global batch. Each
    element rounds with noise drawn from its place in the table, so only a float32 value that
    the two runs sum in another order and that lands on the other side of its rounding
    threshold may differ, by one 16-bit step."""
    spec = dict(
        SPEC, world_size=comm.size(), backend="horovod", block_options={"table_dtype": "bfloat16"}
    )
    ref, model, _, x_mine, y_mine = started_like_reference(spec, tmp_path_factory, seed=15)
    (block,) = embedding_blocks(model)
    assert {block.backend.shard_variable(s)[0].dtype for s in block.plan.shards_on(block.rank)} == {
        tf.bfloat16
    }
    model.compile(optimizer=fc.optimizer("rowwise_adagrad", spec["lr"]))
    model.fit(x_mine, y_mine, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    final = fc.snapshot(model)
    for key, value in final.items():
        want = ref[f"final/{key}"]
        if key.startswith("table/"):
            off = np.abs(value - want) > 1e-7
            assert off.mean() <= 1e-3, (key, off.sum())
            np.testing.assert_allclose(value, want, rtol=2**-7, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5, err_msg=key)
    assert not np.array_equal(final["table/C1"], ref["initial/table/C1"])  # it trained


def test_a_refused_compile_leaves_every_rank_as_it_was(hvd):
    """16-bit tables and an optimizer that cannot train them: every rank refuses, naming the
    table, its dtype and the optimizer, before Merlin's compile wraps anything (the
    MultiOptimizer keeps the optimizers it was given, the model has none), and the retry
    with RowWiseAdagrad trains."""
    import merlin.models.tf as mm

    from merlin_models_de import RowWiseAdagrad

    n, r = comm.size(), comm.rank()
    spec = dict(SPEC, world_size=n, small=True, block_options={"table_dtype": "bfloat16"})
    model = fc.build_model(spec)
    (block,) = embedding_blocks(model)
    adam, sgd = fc.optimizer("adam", 0.01), fc.optimizer("sgd", 0.01)
    multi = mm.MultiOptimizer(
        default_optimizer=adam, optimizers_and_blocks=[mm.OptimizerBlocks(sgd, block)]
    )
    with pytest.raises(ValueError) as refused:
        model.compile(optimizer=multi)
    message = str(refused.value)
    assert f"of block '{block.name}' is stored in bfloat16 (table_dtype='bfloat16')" in message
    assert message.startswith("Table '") and message.endswith("Received: optimizer=SGD")
    assert comm.allgather_object(message) == [message] * n  # every rank, the same words
    pair = multi.optimizers_and_blocks[0]
    assert pair.optimizer is sgd and multi.default_optimizer is adam
    assert not getattr(multi, "_mmde_distributed", False) and model.optimizer is None
    data = fc.only_columns(
        comm.broadcast_object(fc.make_data(n * PER_RANK, seed=6)), fc.small_schema().column_names
    )
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), PER_RANK, n, r)
    model.compile(optimizer=RowWiseAdagrad(0.05))
    model.fit({k: v[rows] for k, v in x.items()}, y[rows], batch_size=PER_RANK, verbose=0)
    assert isinstance(model.optimizer, RowWiseAdagrad)


def _trained(tmp_path_factory, seed):
    spec = dict(SPEC, world_size=comm.size())
    data = comm.broadcast_object(fc.make_data(2 * comm.size() * PER_RANK, seed=seed))
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), PER_RANK, comm.size(), comm.rank())
    model = fc.build_model(spec)
    model(fc.take(x, 0, 2))
    model.compile(optimizer=fc.optimizer("rowwise_adagrad", spec["lr"]))
    model.fit({k: v[rows] for k, v in x.items()}, y[rows], batch_size=PER_RANK, verbose=0)
    directory = comm.broadcast_object(
        str(tmp_path_factory.mktemp("rowwise")) if comm.rank() == 0 else None
    )
    save_checkpoint(model, directory)
    return spec, data, model, directory


def _gathered_row_state(model):
    """``{table: [rows, 1]}``: the ranks' row state put together (rank order)."""
    (block,) = embedding_blocks(model)
    mine = []
    for shard in block.plan.shards_on(block.rank):
        var, first = block.backend.shard_variable(shard)
        state = slots_of(model.optimizer, var)[ROW_SLOT].numpy()[first : first + shard.rows]
        mine.append((shard.table, shard.row_start, state))
    out = {}
    for table, start, state in (e for r in comm.allgather_object(mine) for e in r):
        rows = block.plan.table(table).rows
        whole = out.setdefault(table, np.full((rows, 1), np.nan, np.float32))
        part = whole[start : start + len(state)]
        # a column-sliced table's slices hold the same state
        assert np.isnan(part).all() or np.allclose(part, state, rtol=1e-6), table
        whole[start : start + len(state)] = state
    return out


@pytest.mark.full  # the CI tier's row-wise checkpoint: the 2-rank -> 1-process restore below
def test_checkpoint_holds_one_value_per_row(hvd, tmp_path_factory):
    _, _, model, directory = _trained(tmp_path_factory, seed=14)
    saved = read_full_tables(latest_checkpoint(directory))
    want = _gathered_row_state(model)
    (parts,) = saved.values()
    for table, found in parts.items():
        assert set(found) == {"table", ROW_SLOT}, table
        assert found[ROW_SLOT].shape == (found["table"].shape[0], 1), table
        np.testing.assert_array_equal(found[ROW_SLOT], want[table], err_msg=table)
    # it trained: some rows' state moved from the initial value
    assert any((found[ROW_SLOT] != np.float32(0.1)).any() for found in parts.values())
    manifest = json.load(open(os.path.join(latest_checkpoint(directory), "manifest.json")))
    per_row = {
        p["name"]: p.get("per_row", False)
        for t in manifest["blocks"][0]["tables"]
        for p in t["parts"]
    }
    assert per_row == {"table": False, ROW_SLOT: True}
    # exports hold the tables only: a table export's files, the single-process SavedModel
    (block,) = embedding_blocks(model)
    export = os.path.join(directory, "export")
    table = block.tables[0].name
    export_table(block, table, os.path.join(export, "table"))
    model.save(os.path.join(export, "saved"))
    if comm.rank() == 0:
        files = [n for _, _, names in os.walk(os.path.join(export, "table")) for n in names]
        assert files and not [n for n in files if "accumulator" in n], files
        saved = tf.train.list_variables(os.path.join(export, "saved", "variables", "variables"))
        saved = [n for n, _ in saved]
        assert saved and not [n for n in saved if "accumulator" in n or "optimizer" in n.lower()]
    comm.barrier()


def test_a_two_rank_checkpoint_restores_into_one_process(hvd, tmp_path_factory):
    spec, data, _, directory = _trained(tmp_path_factory, seed=15)
    outcome = None
    if comm.rank() == 0:
        single = str(tmp_path_factory.mktemp("single"))
        path = os.path.join(single, "..", "data.npz")
        np.savez(path, **data)
        env = one_process_env()
        one = dict(spec, world_size=1, strategy="memory_optimized", column=None)
        run = subprocess.run(
            [sys.executable, "-m", "tests.ranks.checkpoint_reference", json.dumps(one), path]
            + [directory, single],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        outcome = (run.returncode, run.stderr[-3000:], single)
    code, stderr, single = comm.broadcast_object(outcome)
    if code != 0:
        raise StorageError(stderr) if "StorageError" in stderr else AssertionError(stderr)
    # the one process restored every row's state and saved it again: the same arrays
    two, one = (
        read_full_tables(latest_checkpoint(directory)),
        read_full_tables(latest_checkpoint(single)),
    )
    for table, parts in next(iter(two.values())).items():
        for what, value in parts.items():
            got = next(iter(one.values()))[table][what]
            np.testing.assert_array_equal(got, value, err_msg=f"{table}/{what}")


def _two_towers(together, steps=2):
    """Two blocks naming the same (column-sliced) tables, each with its own inputs, trained
    by one optimizer (``together``) or one each: their tables after ``steps`` steps."""
    from merlin_models_de import RowWiseAdagrad
    from merlin_models_de.merlin.training import DistributedGradientTape

    blocks = [make_block(strategy="basic", column_slice_threshold=4000) for _ in range(2)]
    assert any(s.kind is ShardingType.COLUMN_WISE for s in blocks[0].plan.shards)
    r, n = comm.rank(), 16
    arrays = oracle.global_tables(blocks[0].tables, 21)
    towers = []
    for k, block in enumerate(blocks):
        batch = oracle.global_batch(block.features, block.tables, 2 * n, 22 + k)
        inputs = oracle.select(batch, r * n, (r + 1) * n)
        block(inputs)
        block.set_global_weights(arrays)
        towers.append((block, inputs, oracle.make_probes(block.features, block.tables, 24 + k)))
    optimizers = [RowWiseAdagrad(0.3)] * 2 if together else [RowWiseAdagrad(0.3) for _ in blocks]
    variables = [v for b in blocks for v in b.trainable_variables]
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = sum(
                oracle.loss_fn(b(x, training=True), b.features, p, tf.zeros([n]))
                for b, x, p in towers
            )
        grads = DistributedGradientTape(tape, variables).gradient(loss, variables)
        pairs = list(zip(grads, variables))
        if together:
            optimizers[0].apply_gradients(pairs)
        else:
            for opt, b in zip(optimizers, blocks):
                mine = {v.ref() for v in b.trainable_variables}
                opt.apply_gradients([(g, v) for g, v in pairs if v.ref() in mine])
    return [b.get_global_weights() for b in blocks]


def test_two_blocks_naming_the_same_tables_keep_their_own_row_state(hvd):
    """One optimizer for two towers' blocks: each block's column-slice sums stay its own."""
    together, apart = _two_towers(True), _two_towers(False)
    for k in range(2):
        for table, value in apart[k].items():
            np.testing.assert_allclose(together[k][table], value, rtol=1e-6, err_msg=table)
    assert not np.allclose(together[0]["user"], together[1]["user"])  # the inputs differ
