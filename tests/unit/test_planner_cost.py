"""The per-step cost model: collectives and bytes of hand-computed plans, the alpha-beta
arithmetic, the cost command's output and its errors. Single process, no Horovod.

Byte counts below are worked out by hand from the backend's exchanges (B ids per lookup,
int64 ids, float32 rows); ``(sent, received, wire)`` per collective, per rank.
"""

import pytest

from merlin_models_de.planner import plan
from merlin_models_de.planner.cost import (
    LINKS,
    Collective,
    Link,
    dlrm_dense_params,
    get_link,
    predict,
    step_costs,
)
from merlin_models_de.tables import FeatureSpec, TableSpec

B = 4  # samples per rank


def one_hot(name, rows=100, dim=8):
    return TableSpec(name, rows, dim, (FeatureSpec(name, name),))


def multi_hot(name, combiner="mean", rows=100, dim=8):
    return TableSpec(name, rows, dim, (FeatureSpec(name, name, True, combiner),))


def summary(costs):
    return [(c.stage, c.kind, c.direction, c.sent, c.received, c.wire) for c in costs.collectives]


def test_table_wise_one_hot_two_ranks():
    # basic: a, c -> rank 0 (12 columns), b -> rank 1 (8 columns)
    costs = step_costs(plan([one_hot("a"), one_hot("b"), one_hot("c", dim=4)], 2), B)
    # ids to rank 0: 8 * (2 header + 2 lookups * 4); to rank 1: 8 * (2 + 4)
    # vectors: rank 0 sends each rank 4 * 12 * 4 = 192, rank 1 sends 4 * 8 * 4 = 128
    assert summary(costs) == [
        ("ids", "alltoall", "fwd", (128, 128), (160, 96), 80),
        ("vectors", "alltoall", "fwd", (384, 256), (320, 320), 192),
        ("vectors", "alltoall", "bwd", (320, 320), (384, 256), 192),
    ]
    assert costs.count == 3 and costs.count_by("alltoall") == 3
    assert costs.sent_per_rank() == (832, 704) and costs.received_per_rank() == (864, 672)


def test_column_sliced_two_and_four_ranks():
    t = one_hot("t", rows=1000, dim=8)
    two = step_costs(plan([t], 2, column_slice_threshold=4000), B)  # 2 slices of 4 columns
    assert summary(two) == [
        ("ids", "alltoall", "fwd", (96, 96), (96, 96), 48),
        ("vectors", "alltoall", "fwd", (128, 128), (128, 128), 64),
        ("vectors", "alltoall", "bwd", (128, 128), (128, 128), 64),
    ]
    four = step_costs(plan([t], 4, column_slice_threshold=2000), B)  # 4 slices of 2 columns
    assert summary(four) == [
        ("ids", "alltoall", "fwd", (192,) * 4, (192,) * 4, 144),
        ("vectors", "alltoall", "fwd", (128,) * 4, (128,) * 4, 96),
        ("vectors", "alltoall", "bwd", (128,) * 4, (128,) * 4, 96),
    ]


def test_multi_hot_lookup_adds_a_values_exchange():
    # a -> rank 0, m (3 ids per sample) -> rank 1; rank 1 gets m's row lengths in "ids"
    costs = step_costs(plan([one_hot("a"), multi_hot("m")], 2), B, hotness={"m": 3})
    assert summary(costs) == [
        ("ids", "alltoall", "fwd", (96, 96), (96, 96), 48),
        ("values", "alltoall", "fwd", (96, 96), (0, 192), 96),
        ("vectors", "alltoall", "fwd", (256, 256), (256, 256), 128),
        ("vectors", "alltoall", "bwd", (256, 256), (256, 256), 128),
    ]
    assert step_costs(plan([one_hot("a"), multi_hot("m")], 2), B, hotness=3) == costs


def test_multi_hot_feature_without_hotness_counts_the_default_ids():
    # planner.hotness: 4 ids a sample, as work_balanced places and rank_times prices it
    p = plan([one_hot("a"), multi_hot("m")], 2)
    costs = step_costs(p, B)
    assert summary(costs)[1] == ("values", "alltoall", "fwd", (128, 128), (0, 256), 128)
    assert step_costs(p, B, hotness={"a": 9}) == costs == step_costs(p, B, hotness=4)
    assert step_costs(p, B, hotness={"m": None}) == costs != step_costs(p, B, hotness=5)


def test_row_sliced_table_allgathers_ids_and_sums_rows():
    costs = step_costs(plan([one_hot("r")], 2, row_slice_threshold=1), B)
    assert summary(costs) == [
        ("ids", "alltoall", "fwd", (32, 32), (32, 32), 16),  # the header only
        ("rw_r_ids", "allgather", "fwd", (32, 32), (64, 64), 32),
        ("rw_r_vectors", "alltoall", "fwd", (256, 256), (256, 256), 128),
        ("rw_r_vectors", "alltoall", "bwd", (256, 256), (256, 256), 128),
    ]
    multi = step_costs(
        plan([multi_hot("r", combiner="sum")], 2, row_slice_threshold=1), B, hotness=2
    )
    assert [(c.stage, c.sent) for c in multi.collectives] == [
        ("ids", (32, 32)),
        ("rw_r_ids", (64, 64)),
        ("rw_r_lengths", (32, 32)),
        ("rw_r_vectors", (256, 256)),
        ("rw_r_vectors", (256, 256)),
    ]


def test_data_parallel_table_is_allreduced_with_the_dense_gradients_four_ranks():
    tables = [one_hot("a", rows=10, dim=4), one_hot("b", rows=1000, dim=8)]
    p = plan(tables, 4, data_parallel_threshold=40, column_slice_threshold=10**9)
    costs = step_costs(p, B, dense_params=100)
    # only b (rank 0) is exchanged; a's 40 elements join the 100 dense ones: 560 bytes
    assert summary(costs) == [
        ("ids", "alltoall", "fwd", (96,) * 4, (192, 64, 64, 64), 144),
        ("vectors", "alltoall", "fwd", (512, 0, 0, 0), (128,) * 4, 384),
        ("vectors", "alltoall", "bwd", (128,) * 4, (512, 0, 0, 0), 384),
        ("dense", "allreduce", "bwd", (560,) * 4, (560,) * 4, 840),  # 2 * 3/4 * 560
    ]
    rounds = step_costs(p, B, dense_params=100, allreduce_rounds=3)
    assert [c.sent[0] for c in rounds.collectives if c.kind == "allreduce"] == [187, 187, 186]


def test_sequence_feature_sends_one_row_per_id():
    # a -> rank 0 (pooled), s (un-pooled, 5 ids per sample) -> rank 1
    costs = step_costs(plan([one_hot("a"), multi_hot("s", combiner=None)], 2), B, hotness=5)
    assert summary(costs) == [
        ("ids", "alltoall", "fwd", (96, 96), (96, 96), 48),
        ("values", "alltoall", "fwd", (160, 160), (0, 320), 160),
        ("vectors", "alltoall", "fwd", (256, 0), (128, 128), 128),
        ("sequences", "alltoall", "fwd", (0, 1280), (640, 640), 640),  # 4 * 5 * 8 * 4
        ("sequences", "alltoall", "bwd", (640, 640), (0, 1280), 640),
        ("vectors", "alltoall", "bwd", (128, 128), (256, 0), 128),
    ]


def test_narrow_exchange_halves_the_model_parallel_rows_only():
    # a: the only model-parallel table, so column sliced (4 columns per rank, 2-byte rows);
    # r: row sliced (4-byte partial rows)
    tables = [one_hot("a"), one_hot("r", rows=1000)]
    p = plan(tables, 2, row_slice_threshold=8000)
    costs = step_costs(p, B, exchange_bytes=2)
    assert summary(costs) == [
        ("ids", "alltoall", "fwd", (96, 96), (96, 96), 48),
        ("vectors", "alltoall", "fwd", (64, 64), (64, 64), 32),  # 2 ranks * 4 * 4 cols * 2
        ("rw_r_ids", "allgather", "fwd", (32, 32), (64, 64), 32),
        ("rw_r_vectors", "alltoall", "fwd", (256, 256), (256, 256), 128),  # 2 * 4 * 8 * 4
        ("rw_r_vectors", "alltoall", "bwd", (256, 256), (256, 256), 128),
        ("vectors", "alltoall", "bwd", (64, 64), (64, 64), 32),
    ]
    full = step_costs(p, B)
    assert [c.wire for c in full.collectives] == [48, 64, 32, 128, 128, 64]


def test_one_rank_has_no_collectives():
    costs = step_costs(plan([one_hot("a")], 1), B, dense_params=10)
    assert costs.count == 0 and predict(costs, LINKS["nvlink-nccl"]) == 0


def test_uniform_alltoall_and_ring_allreduce_wire_factors():
    for n in (2, 4, 8):
        tables = [one_hot(f"t{i}") for i in range(n)]  # one table per rank
        costs = step_costs(plan(tables, n), 64, dense_params=1000)
        vectors = next(c for c in costs.collectives if c.stage == "vectors")
        assert vectors.wire == vectors.sent[0] * (n - 1) // n
        dense = next(c for c in costs.collectives if c.kind == "allreduce")
        assert dense.wire == 2 * (n - 1) * 4000 // n


def test_alpha_beta_arithmetic():
    link = Link("l", alpha_ms=0.5, beta_gbps=2.0, allreduce_alpha_ms=1.0, allreduce_beta_gbps=1.0)
    assert link.time_ms("alltoall", 4_000_000) == pytest.approx(0.5 + 2.0)
    assert link.time_ms("allgather", 0) == pytest.approx(0.5)
    assert link.time_ms("allreduce", 4_000_000) == pytest.approx(1.0 + 4.0)
    costs = step_costs(plan([one_hot("a"), one_hot("b")], 2), 1000, dense_params=250_000)
    # ids 8 * (2 + 1000) per owner, vectors 1000 * 8 * 4 per owner and rank, 1 MB allreduced
    expected = (0.5 + 8016 / 2e6) + 2 * (0.5 + 32000 / 2e6) + (1.0 + 1_000_000 / 1e6)
    assert predict(costs, link) == pytest.approx(expected)
    with pytest.raises(ValueError, match=r"Received: kind='gather'"):
        link.time_ms("gather", 1)


def test_dlrm_dense_params_match_the_measured_gradient_bytes():
    # the step breakdown measured 10 dense gradients of 237 KB for DLRM on Criteo, dim 16
    assert dlrm_dense_params(13, 26, 16, [128], [128, 64]) * 4 == 237_124


def test_unknown_link_names_it_and_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_link("ethernet")
    assert str(err.value) == (
        "Unknown link; expected one of ['gloo-loopback', 'infiniband-nccl', "
        "'nvlink-nccl']. Received: link='ethernet'"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size must be an int >= 1. Received: batch_size=0"),
        (dict(batch_size=4, dense_params=-1), "Received: dense_params=-1"),
        (dict(batch_size=4, allreduce_rounds=0), "Received: allreduce_rounds=0"),
        (
            dict(batch_size=4, hotness={"m": -2}),
            "hotness of feature 'm' must be a number >= 0. Received: hotness={'m': -2}",
        ),
        (
            dict(batch_size=4, hotness="lots"),
            "hotness must be a number >= 0 or a dict of them by feature. Received: hotness='lots'",
        ),
    ],
)
def test_bad_input_errors(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        step_costs(plan([one_hot("a"), multi_hot("m")], 2), **kwargs)


def test_collective_is_plain_data():
    c = Collective("ids", "alltoall", "fwd", (1, 2), (2, 1), 1)
    assert (c.max_sent, c.max_received) == (2, 2)


CRITEO_LINES = [
    "criteo: 26 features in 26 tables, dim 16, memory_optimized; 2 ranks x 512 = 1,024 samples "
    "per step; 59,281 dense parameters; bytes per step",
    "stage            kind      dir   sent/rank   recv/rank        wire       nvlink-nccl ms",
    "ids              alltoall  fwd     127,008     204,832     102,416                0.030",
    "vectors          alltoall  fwd   1,474,560     851,968     737,280                0.033",
    "vectors          alltoall  bwd     851,968   1,474,560     737,280                0.033",
    "dense            allreduce bwd     118,562     118,562     118,562                0.031",
    "dense            allreduce bwd     118,562     118,562     118,562                0.031",
    "total            5               2,690,660   2,768,484   1,814,100                0.158",
    "5 collectives per step (3 alltoall, 2 allreduce)",
    "per rank on nvlink-nccl (adagrad): r0 0.41 ms (25 lookups, compute 0.26), "
    "r1 0.22 ms (6 lookups, compute 0.06)",
]


def test_cost_command_prints_the_collectives_of_dlrm_on_criteo(capsys):
    from merlin_models_de.apps.bench.cost import main

    code = main(
        [
            "--dataset",
            "criteo",
            "--np",
            "2",
            "--batch-size",
            "512",
            "--dim",
            "16",
            "--strategy",
            "memory_optimized",
            "--column-slice-threshold",
            str(2**24),
            "--links",
            "nvlink-nccl",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.splitlines() == CRITEO_LINES


def test_cost_command_places_work_balanced_for_its_step(capsys):
    from merlin_models_de.apps.bench.cost import main

    args = ["--dataset", "criteo", "--np", "2", "--links", "gloo-loopback", "--optimizer", "sgd"]
    assert main(args + ["--strategy", "work_balanced"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("per rank on gloo-loopback (sgd): r0 ")
    assert line.count("(13 lookups") == 2, line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--links", "nvlink-nccl,ethernet"], "Received: link='ethernet'"),
        (["--np", "8", "--global-batch-size", "100"], "--global-batch-size must divide"),
        (["--hotness", "lots"], "Received: --hotness='lots'"),
        (["--hotness", "foo=2"], "not multi-hot features of the schema ([]). Received: ['foo']"),
    ],
)
def test_cost_command_bad_options_exit_2_with_one_line(capsys, args, message):
    from merlin_models_de.apps.bench.cost import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_link_probe_fit_recovers_alpha_and_beta():
    from merlin_models_de.apps.tools.link_probe import fit

    # 1.2 ms + bytes / 1.1 GB/s, at the probe's sizes
    points = [(w, 1.2 + w / 1.1e6) for w in (512, 8192, 131072, 2097152)]
    assert fit(points) == (1.2, 1.1)
    with pytest.raises(ValueError, match=r"two different sizes. Received: \[512\]"):
        fit([(512, 1.0), (512, 2.0)])
