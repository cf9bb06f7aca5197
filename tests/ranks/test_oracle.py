"""Horovod backend against the single-process oracle, under horovodrun -np 2."""

import numpy as np
import pytest

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.planner import ShardingType
from tests.ranks import oracle
from tests.tiers import diagonal

PER_RANK = 16

# (id, placement options, kinds that must appear in the plan)
PLACEMENTS = [
    ("basic", dict(strategy="basic"), {ShardingType.TABLE_WISE}),
    ("memory_balanced", dict(strategy="memory_balanced"), {ShardingType.TABLE_WISE}),
    ("memory_optimized", dict(strategy="memory_optimized"), {ShardingType.TABLE_WISE}),
    ("work_balanced", dict(strategy="work_balanced"), {ShardingType.TABLE_WISE}),
    (
        "basic-column",
        dict(strategy="basic", column_slice_threshold=4000),
        {ShardingType.COLUMN_WISE},
    ),
    (
        "balanced-column",
        dict(strategy="memory_balanced", column_slice_threshold=2000),
        {ShardingType.COLUMN_WISE},
    ),
    (
        "optimized-column",
        dict(strategy="memory_optimized", column_slice_threshold=3000),
        {ShardingType.COLUMN_WISE},
    ),
    (
        "work-column",
        dict(strategy="work_balanced", column_slice_threshold=3000),
        {ShardingType.COLUMN_WISE},
    ),
    (
        "data-parallel",
        dict(strategy="basic", data_parallel_threshold=700),
        {ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE},
    ),
    (
        "row-sliced",
        dict(strategy="memory_balanced", row_slice_threshold=3000),
        {ShardingType.ROW_WISE, ShardingType.TABLE_WISE},
    ),
    (
        "everything",
        dict(
            strategy="memory_optimized",
            column_slice_threshold=6000,
            data_parallel_threshold=60,
            row_slice_threshold=10_000,
        ),
        {ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL, ShardingType.COLUMN_WISE},
    ),
]


def make_block(combiners=oracle.COMBINERS, **options):
    return DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        sequence_combiner=combiners,
        backend="horovod",
        **options,
    )


@pytest.mark.parametrize(
    "case, optimizer", diagonal(PLACEMENTS, ["sgd", "adagrad"], ids=(lambda p: p[0], str))
)
def test_forward_and_training_match_the_oracle(hvd, case, optimizer):
    _, options, kinds = case
    block = make_block(**options)
    present = {s.kind for s in block.plan.shards}
    assert kinds <= present, (kinds, present)
    oracle.assert_matches_oracle(block, optimizer, seed=sum(map(ord, case[0] + optimizer)))


def test_adam_matches_the_oracle(hvd):
    block = make_block(strategy="memory_balanced", column_slice_threshold=4000)
    oracle.assert_matches_oracle(block, "adam", seed=7)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("exchange_dtype", [None, "bfloat16"])
def test_the_merged_backward_of_the_optimizer_matches_the_oracle(hvd, exchange_dtype, graph):
    """The optimizer ``compile`` makes: the rows' gradients go back in the all-to-all that
    averages the global (data-parallel) gradients; in bfloat16 they travel as bits beside
    the float32 ones. Every placement kind, frozen shards included."""
    _, options, _ = PLACEMENTS[-1]
    block = make_block(exchange_dtype=exchange_dtype, trainable={"item": False}, **options)
    oracle.assert_matches_oracle(
        block, "adagrad", seed=13, graph=graph, via_optimizer=True, frozen=("item",)
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_graph_mode_training_matches_the_oracle(hvd, optimizer):
    _, options, _ = PLACEMENTS[-1]
    oracle.assert_matches_oracle(make_block(**options), optimizer, seed=11, graph=True)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize(
    "exchange_dtype,case",
    [("float16", PLACEMENTS[0]), ("bfloat16", PLACEMENTS[5]), ("bfloat16", PLACEMENTS[-1])],
    ids=["float16-basic", "bfloat16-optimized-column", "bfloat16-everything"],
)
def test_narrow_exchange_matches_the_oracle_rounding_the_same_rows(
    hvd, exchange_dtype, case, graph
):
    """Rows and their gradients cross ranks in float16 / bfloat16: N ranks == one process
    whose model-parallel rows are rounded the same (data-parallel and row-sliced: not)."""
    block = make_block(exchange_dtype=exchange_dtype, **case[1])
    oracle.assert_matches_oracle(
        block, "adagrad", seed=sum(map(ord, exchange_dtype + case[0])), graph=graph
    )


def test_each_rank_holds_only_its_share(hvd):
    block = make_block(strategy="memory_optimized", column_slice_threshold=4000)
    block(oracle.select(oracle.global_batch(block.features, block.tables, 4, 0), 0, 4))
    shards = [v for v in block.local_variables if v.shape.rank == 2]
    assert len(shards) == len(block.local_variables) - 1  # and the exchange anchor, a scalar
    local = sum(int(np.prod(v.shape)) for v in shards)
    assert local == block.plan.rank_elements(comm.rank())
    total = sum(t.elements for t in block.tables)
    assert local < 0.6 * total


def test_graph_mode_matches_eager(hvd):
    import tensorflow as tf

    block = make_block(
        strategy="memory_balanced",
        column_slice_threshold=4000,
        data_parallel_threshold=60,
        row_slice_threshold=10_000,
    )
    batch = oracle.global_batch(block.features, block.tables, 2 * PER_RANK, 5)
    r = comm.rank()
    inputs = oracle.select(batch, r * PER_RANK, (r + 1) * PER_RANK)
    eager = block(inputs)
    graph = tf.function(lambda x: block(x))(inputs)
    for name, value in eager.items():
        np.testing.assert_allclose(graph[name].numpy(), value.numpy(), rtol=1e-6)


@pytest.mark.parametrize("case", PLACEMENTS, ids=[p[0] for p in PLACEMENTS])
def test_unpooled_sequences_match_the_oracle(hvd, case):
    """sequence_combiner=None: ragged [B, None, dim] outputs for every sharding kind."""
    _, options, _ = case
    block = make_block(combiners=oracle.SEQUENCE_COMBINERS, **options)
    oracle.assert_matches_oracle(block, "adagrad", seed=sum(map(ord, "seq" + case[0])))


def test_unpooled_sequences_in_graph_mode_match_the_oracle(hvd):
    block = make_block(
        combiners=oracle.SEQUENCE_COMBINERS,
        strategy="memory_optimized",
        column_slice_threshold=3000,
        row_slice_threshold=10_000,
        data_parallel_threshold=60,
    )
    oracle.assert_matches_oracle(block, "sgd", seed=11, graph=True)


def test_outputs_keep_the_static_batch_size_in_a_graph(hvd):
    """With a static batch (Keras fit on NumPy arrays), every output has it in a graph,
    whatever the sharding kind: Merlin's concatenation refuses a mix of known and unknown
    batch sizes."""
    import tensorflow as tf

    block = make_block(**dict((p[0], p[1]) for p in PLACEMENTS)["everything"])
    batch = oracle.global_batch(block.features, block.tables, comm.size() * PER_RANK, seed=3)
    r = comm.rank()
    inputs = oracle.select(batch, r * PER_RANK, (r + 1) * PER_RANK)
    static = {}

    @tf.function
    def forward(x):
        out = block(x)
        static.update({k: v.shape[0] for k, v in out.items()})  # while tracing
        return out

    forward(inputs)
    assert static == {f.name: PER_RANK for f in block.features}, static
