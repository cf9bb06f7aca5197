"""The `python -m merlin_models_de.apps.tools.plan` command, run as a real subprocess."""

import os
import subprocess
import sys

import pytest

from merlin_models_de.apps.common.options import parse_bytes
from merlin_models_de.apps.tools.plan import MAX_PLANS, busiest_elements, smallest_world_size
from merlin_models_de.planner import plan

# What Merlin and TensorFlow print on import when nobody silences them.
NOISE = (
    "UserWarning",
    "dtype mappings did not load",
    "NVTabular Dataset in CPU mode",
    "I tensorflow/",
    "Please fix your imports",
)


def run(*args, timeout=300, quiet_env=True):
    env = dict(os.environ)
    for name in ("PYTHONWARNINGS", "TF_CPP_MIN_LOG_LEVEL"):
        env.pop(name, None)
    if quiet_env:
        env.update(PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-m", "merlin_models_de.apps.tools.plan", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_criteo_plan_and_device_memory():
    out = run(
        "criteo",
        "--world-size",
        "4",
        "--strategy",
        "memory_optimized",
        "--column-slice-threshold",
        str(2**24),
        "--dim",
        "16",
        "--optimizer",
        "adagrad",
        "--device-memory",
        "1GB",
    )
    assert out.returncode == 0, out.stderr
    assert "ShardingPlan: 26 tables, world_size=4, strategy=memory_optimized" in out.stdout
    assert "optimizer=adagrad (+1 slot copies)" in out.stdout
    # 45.6M rows * 16 * 4 B * 2 (adagrad) = 5.84 GB: at least 6 ranks of 1 GB
    line = [l for l in out.stdout.splitlines() if l.startswith("Smallest world size")][0]
    assert int(line.split(": ")[1].split()[0]) >= 6


def test_schema_file_and_dataset_directory(tmp_path, synthetic_schema):
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    TensorflowMetadata.from_merlin_schema(synthetic_schema("music-streaming")).to_proto_text_file(
        str(tmp_path)
    )
    for source in (str(tmp_path), str(tmp_path / "schema.pbtxt")):
        out = run(source, "--world-size", "2", "--dim", "8")
        assert out.returncode == 0, out.stderr
        assert "world_size=2, strategy=work_balanced" in out.stdout


def test_defaults_are_the_dlrm_commands_and_each_rank_lists_its_slices():
    from merlin_models_de.apps.dlrm import options as dlrm_options
    from merlin_models_de.apps.tools.plan import _parser

    ours, theirs = _parser().parse_args(["criteo"]), dlrm_options.parser().parse_args([])
    for option in (
        "strategy",
        "dim",
        "optimizer",
        "column_slice_threshold",
        "row_slice_threshold",
        "data_parallel_threshold",
    ):
        assert getattr(ours, option) == getattr(theirs, option), option
    out = run("criteo", "--world-size", "2", "--column-slice-threshold", str(2**24))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        "Planned for strategy=work_balanced, optimizer=adagrad, dim=16 (defaults: the DLRM "
        "command's; mm.DistributedEmbeddings places with strategy='basic' unless given one"
    )
    assert "strategy=work_balanced, optimizer=adagrad (+1 slot copies)" in out.stdout
    ranks = [l for l in out.stdout.splitlines() if l.startswith("rank ") and ":" in l]
    assert [l.split(":")[0] for l in ranks] == ["rank 0", "rank 1"]
    # Criteo's 10M-row tables (x16 = 2**27 elements) are cut into 2 column slices of 8
    for rank, cols in ((0, "0-7"), (1, "8-15")):
        assert f"C1 10,000,000x8 (columns {cols} of 16)" in ranks[rank], ranks[rank]
    whole = [t for l in ranks for t in l.split(": ")[1].split(", ") if "(" not in t]
    assert "C6 4x16" in whole and len(whole) == 26 - 5  # 5 tables above 2**24 are sliced
    # the memory model (planner.memory): runtime + each rank's tables with their Adagrad slots
    from merlin_models_de.apps.common.schemas import synthetic_schema
    from merlin_models_de.planner import plan as make_plan
    from merlin_models_de.planner.memory import plan_peak_bytes
    from merlin_models_de.tables import human_bytes, tables_from_schema

    placed = make_plan(
        tables_from_schema(synthetic_schema("criteo"), dim=16),
        2,
        strategy="work_balanced",
        column_slice_threshold=2**24,
    )
    peaks = ", ".join(
        f"r{r} {human_bytes(b)}" for r, b in enumerate(plan_peak_bytes(placed, "adagrad"))
    )
    assert (
        f"predicted peak resident memory per rank (runtime + tables with slots): {peaks}"
        in out.stdout
    )


def test_each_rank_prints_its_predicted_step_and_memory():
    from merlin_models_de.apps.common.schemas import synthetic_schema
    from merlin_models_de.planner.work import rank_times
    from merlin_models_de.tables import human_bytes, tables_from_schema

    out = run(
        "criteo", "--strategy", "work_balanced", "--optimizer", "sgd", "--link", "nvlink-nccl"
    )
    assert out.returncode == 0, out.stderr
    tables = tables_from_schema(synthetic_schema("criteo"), dim=16)
    placed = plan(tables, 2, "work_balanced", optimizer="sgd", link="nvlink-nccl")
    lines = out.stdout.splitlines()
    head = lines.index(
        "predicted step per rank on nvlink-nccl, 512 samples a rank (embedding lookups, "
        "updates and exchanges; the dense layers left out):"
    )
    assert lines[head + 1].split() == [
        "rank", "lookups", "compute", "ms", "exchange", "ms", "step", "ms", "memory"
    ]  # fmt: skip
    times = rank_times(placed, 512, link="nvlink-nccl", optimizer="sgd")
    for t, line in zip(times, lines[head + 2 : head + 4]):
        memory = human_bytes(placed.rank_bytes(t.rank, "sgd"))
        assert line.split() == [
            str(t.rank),
            "13",
            f"{t.compute_ms:.2f}",
            f"{t.comm_ms:.2f}",
            f"{t.total_ms:.2f}",
            *memory.split(),
        ]
    assert lines[head + 4].startswith("busiest rank ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["criteo", "--world-size", "0"], "Received: world_size=0"),
        (["criteo", "--column-slice-threshold", "-1"], "Received: column_slice_threshold=-1"),
        (["no-such-dataset"], "Received: schema='no-such-dataset'"),
        (["criteo", "--device-memory", "lots"], "Received: --device-memory='lots'"),
        (["criteo", "--batch-size", "0"], "Received: --batch-size=0"),
        (["criteo", "--hotness", "a=b"], "Received: --hotness='a=b'"),
    ],
)
def test_bad_options_exit_non_zero_with_a_clear_line(args, message):
    out = run(*args)
    assert out.returncode == 2 and message in out.stderr


def test_parse_bytes():
    assert parse_bytes("80GB", "--device-memory") == 80 * 10**9
    assert parse_bytes("16GiB", "--device-memory") == 16 * 2**30
    assert parse_bytes("512", "--budget") == 512
    with pytest.raises(
        ValueError,
        match=r"^--budget must look like '80GB' or '16GiB'\. Received: --budget='lots'$",
    ):
        parse_bytes("lots", "--budget")


@pytest.mark.parametrize("memory", ["0GB", "0", "0.1B"])
def test_device_memory_of_zero_is_refused_at_once(memory):
    out = run("criteo", "--device-memory", memory, timeout=120)
    assert out.returncode == 2, out.stdout[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"error: --device-memory must be > 0. Received: --device-memory={memory!r}"
    ]


@pytest.mark.parametrize(
    "memory, options",
    [
        ("1B", []),
        pytest.param(
            "1KB",
            ["--strategy", "memory_optimized", "--column-slice-threshold", "1000"],
            marks=pytest.mark.full,
        ),
        pytest.param("50MB", ["--strategy", "memory_optimized"], marks=pytest.mark.full),
        ("2MB", ["--row-slice-threshold", "1000000"]),
        pytest.param(
            "600MB",
            ["--data-parallel-threshold", "100000", "--strategy", "memory_balanced"],
            marks=pytest.mark.full,
        ),
    ],
)
def test_device_memory_search_answers_fast_for_any_capacity(memory, options):
    # 45.6M rows at dim 16: small capacities used to plan up to 4096 world sizes (minutes)
    out = run("criteo", "--dim", "16", "--device-memory", memory, *options, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith(("Smallest world size", "No world size up to ")), last


@pytest.mark.parametrize(
    "schema, memory, step, fits",
    [
        ("criteo", "1.85GB", [], 5),
        ("criteo", "1.85GB", ["--batch-size", "64"], 4),
        ("criteo", "1.85GB", ["--link", "nvlink-nccl"], 4),
        ("music-streaming", "2580000", [], 3),  # its schema's value_count: 4 ids a sample
        ("music-streaming", "2580000", ["--hotness", "1"], 2),
    ],
)
def test_device_memory_search_places_for_the_commands_step(capsys, schema, memory, step, fits):
    """work_balanced places for the step it is given (--batch-size, --link, --hotness), and
    so does the search: the busiest rank it finds is the printed plan's at that world size."""
    from merlin_models_de.apps.tools.plan import main

    code = main(
        [schema, "--dim", "16", "--world-size", str(fits), "--device-memory", memory, *step]
    )
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    found = [l for l in lines if l.startswith("Smallest world size")]
    assert found and found[0].startswith(
        f"Smallest world size whose busiest rank fits {memory}: {fits} (busiest rank "
    ), found
    busiest = found[0].split("(busiest rank ")[1].split(" with")[0]
    head = next(i for i, l in enumerate(lines) if l.startswith("predicted step per rank"))
    memories = [" ".join(l.split()[-2:]) for l in lines[head + 2 : head + 2 + fits]]
    assert busiest in memories, (busiest, memories)


def test_smallest_world_size_is_the_smallest_that_fits_and_is_bounded(synthetic_schema):
    from merlin_models_de.tables import tables_from_schema

    tables = tables_from_schema(synthetic_schema("criteo"), dim=16)
    cases = [
        (10**9, "adagrad", dict(strategy="memory_optimized", column_slice_threshold=2**24)),
        (10**9, "sgd", dict(strategy="basic")),
        (3 * 10**8, "adam", dict(strategy="memory_balanced")),
        (10**6, "sgd", dict(strategy="basic", row_slice_threshold=10**6)),
        (1, "sgd", dict(strategy="basic")),
        (2**20, "sgd", dict(strategy="memory_optimized", data_parallel_threshold=2**20)),
        (185 * 10**7, "adagrad", dict(strategy="work_balanced", batch_size=64)),
    ]
    for capacity, optimizer, options in cases:
        fit = smallest_world_size(tables, capacity, optimizer, **options)
        # bounded by the plans it makes, not by the clock (it once planned 4096 world sizes)
        assert (fit.plans or 0) <= MAX_PLANS, (capacity, options, fit.plans)
        per_element = 4 * (1 + {"sgd": 0, "adagrad": 1, "adam": 2}[optimizer])
        if fit.world_size is None:
            assert fit.reason, (capacity, options)
            continue
        n = fit.world_size
        p = plan(tables, n, **options)
        assert max(p.rank_elements(r) for r in range(n)) * per_element == fit.busiest_bytes
        assert fit.busiest_bytes <= capacity
        if n > 1:  # one rank fewer does not fit
            assert busiest_elements(tables, n - 1, **options) * per_element > capacity
    none = smallest_world_size(tables, 1, "sgd")
    assert none.world_size is None and "cannot be cut below" in none.reason


def test_malformed_or_unreadable_schema_file_is_named(tmp_path, capsys):
    """The first case as a command (one line on stderr, nothing else); the others call the
    command's main in this process (a subprocess costs ~9 s of imports each)."""
    from merlin_models_de.apps.tools.plan import main

    bad = tmp_path / "schema.pbtxt"
    bad.write_text('feature { name: "x" type: \n')  # cut short
    binary = tmp_path / "binary.pbtxt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    broken_json = tmp_path / "schema.json"
    broken_json.write_text('{"feature": [')
    empty = tmp_path / "empty.pbtxt"
    empty.write_text("")
    out = run(str(bad))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert f"Received: schema={str(bad)!r}" in lines[0], lines
    for source, named in (
        (str(tmp_path), str(bad)),
        (str(binary), str(binary)),
        (str(broken_json), str(broken_json)),
        (str(empty), str(empty)),
    ):
        code = main([source])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (source, lines)
        assert f"Received: schema={named!r}" in lines[0], lines


def test_unknown_name_is_refused_before_tensorflow_loads():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom merlin_models_de.apps.tools.plan import main\n"
            "code = main(['no-such-dataset'])\nassert 'tensorflow' not in sys.modules\n"
            "sys.exit(code)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Received: schema='no-such-dataset'" in out.stderr


def test_no_import_noise_reaches_the_user():
    out = run("criteo", "--world-size", "2", quiet_env=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not [
        line for line in out.stderr.splitlines() if any(n in line for n in NOISE)
    ], out.stderr


def test_16_bit_tables_take_2_bytes_a_parameter_and_float32_state(synthetic_schema):
    from merlin_models_de.tables import tables_from_schema

    tables = tables_from_schema(synthetic_schema("criteo"), dim=16)
    p = plan(tables, 2, strategy="memory_optimized")
    for r in range(2):
        elements, rows = p.rank_elements(r), sum(s.rows for s in p.shards_on(r))
        assert p.rank_bytes(r, "rowwise_adagrad", table_bytes=2) == elements * 2 + rows * 4
        assert p.rank_bytes(r, "adagrad", table_bytes=2) == elements * (2 + 4)
    busiest = max(p.rank_bytes(r, "rowwise_adagrad", table_bytes=2) for r in range(2))
    fit = smallest_world_size(
        tables, busiest, "rowwise_adagrad", table_bytes=2, strategy="memory_optimized"
    )
    assert (fit.world_size, fit.busiest_bytes) == (2, busiest)
    out = run(
        "criteo", "--world-size", "2", "--optimizer", "rowwise_adagrad", "--table-dtype", "bfloat16"
    )
    assert out.returncode == 0, out.stderr
    wide = run("criteo", "--world-size", "2", "--optimizer", "rowwise_adagrad")
    total = [l for l in out.stdout.splitlines() if l.startswith("total ")][0]
    assert total.startswith("total 1.4 GiB params")  # 2.7 GiB in float32
    assert [l for l in wide.stdout.splitlines() if l.startswith("total ")][0].startswith(
        "total 2.7 GiB params"
    )
    bad = run("criteo", "--table-dtype", "int8")
    assert bad.returncode == 2 and "--table-dtype" in bad.stderr


def test_dynamic_tables_show_each_ranks_key_maps(capsys, synthetic_schema):
    """--dynamic FEATURE[=CAPACITY] (the DLRM command's option): the table's rows are its
    capacity (default: the cardinality), sliced over the ranks; one line per rank shows its
    key maps at 56 bytes a row, and its bytes with slots and predicted peak include them."""
    from merlin_models_de.apps.tools.plan import key_map_lines, main
    from merlin_models_de.tables import tables_from_schema

    fixed = plan(tables_from_schema(synthetic_schema("criteo"), dim=16), 2)
    assert key_map_lines(fixed) == []  # no dynamic table, no line
    base = ["criteo", "--world-size", "2", "--strategy", "memory_optimized"]
    assert main([*base, "--dynamic", "C1", "--dynamic", "C10=1000000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("key maps of dynamic tables"))
    assert "56 B a row of its share" in lines[head]
    # C1: 10M rows, C10: 1M rows, half of each on each rank: 5.5M rows * 56 B = 293.7 MiB
    assert lines[head + 1 : head + 3] == [
        "rank 0: 293.7 MiB (C1 5,000,000 rows, C10 500,000 rows)",
        "rank 1: 293.7 MiB (C1 5,000,000 rows, C10 500,000 rows)",
    ]
    assert lines[head + 3].startswith("predicted peak resident memory per rank")
    assert main([*base, "--dynamic", "C99"]) == 2
    assert "--dynamic names a column that is not in the schema" in capsys.readouterr().err
    assert main([*base, "--dynamic", "C1=x"]) == 2
    assert "--dynamic takes FEATURE or FEATURE=CAPACITY" in capsys.readouterr().err
