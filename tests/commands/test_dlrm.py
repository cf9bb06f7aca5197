"""The DLRM command: option errors, synthetic data, single-process and horovodrun runs,
checkpoint resume, export, a parquet directory with unequal partitions (the bench:
test_bench_dlrm.py; a rank's cores: test_cores.py)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from merlin_models_de.apps.common.huge_pages import glibc_version, relaunch_env, thp_mode
from merlin_models_de.apps.common.synthetic import make_rows, rank_rows
from merlin_models_de.apps.dlrm.__main__ import main as dlrm_main
from tests.commands.launch import HOROVODRUN
from tests.commands.launch import QUIET_ENV as ENV

QUICK = [
    "--max-table-rows",
    "1000",
    "--batch-size",
    "64",
    "--dim",
    "8",
    "--bottom-mlp",
    "16",
    "--top-mlp",
    "16",
    "--quiet",
]


def _run(args, ranks=1, timeout=600, env=None):
    cmd = [sys.executable, "-m", "merlin_models_de.apps.dlrm", *args]
    if ranks > 1:  # local ranks: Gloo and the driver address on loopback
        cmd = [
            HOROVODRUN,
            "--gloo",
            "-np",
            str(ranks),
            "-H",
            f"localhost:{ranks}",
            "--network-interface",
            "lo",
            *cmd,
        ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env or ENV, check=False
    )


def check_plain_run_output(run):
    """Asserts what a plain one-process run of the DLRM command over 2 epochs printed (the
    run itself is test_single_process_run_checkpoint_and_resume's first run, started without
    --quiet and without logging variables)."""
    summaries = [l for l in run.stdout.splitlines() if l.startswith("epoch ")]
    assert [l.split(":")[0] for l in summaries] == ["epoch 1", "epoch 2"], run.stdout
    assert "Epoch 1/2" not in run.stdout and "Epoch 2/2" not in run.stdout, run.stdout
    both = run.stdout + run.stderr
    assert "is slow compared to the batch time" not in both, both[-3000:]
    assert not [
        l for l in run.stderr.splitlines() if " I tensorflow/" in l or " W tensorflow/" in l
    ], run.stderr[-3000:]
    assert "DistributedEmbeddings runs in one process (not started by a launcher)" in run.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--strategy", "fastest"], "argument --strategy: invalid choice: 'fastest'"),
        (["--batch-size", "0"], "--batch-size must be >= 1. Received: 0"),
        (["--steps-per-execution", "0"], "--steps-per-execution must be >= 1. Received: 0"),
        (["--optimizer", "lamb"], "argument --optimizer: invalid choice: 'lamb'"),
        (["--rows", "100", "--batch-size", "512"], "--rows must hold at least one global batch"),
        (["--valid-dir", "/tmp"], "--valid-dir needs --train-dir"),
        (["--column-slice-threshold", "0"], "column_slice_threshold"),
        (
            ["--learning-rate", "inf"],
            "--learning-rate must be a finite number > 0. Received: --learning-rate=inf",
        ),
        (["--learning-rate", "nan"], "Received: --learning-rate=nan"),
        (["--learning-rate", "-1"], "Received: --learning-rate=-1.0"),
        (["--dataset", "nosuch"], "--dataset must name a Merlin synthetic dataset"),
        (
            ["--checkpoint-keep", "2"],
            "--checkpoint-keep needs --checkpoint-dir. Received: --checkpoint-keep=2",
        ),
        (
            ["--checkpoint-dir", "ckpt", "--checkpoint-keep", "-1"],
            "--checkpoint-keep must be >= 0. Received: --checkpoint-keep=-1",
        ),
        (
            ["--optimizer", "rowwise_adagrad", "--embeddings", "merlin"],
            "Use --embeddings distributed. Received: --optimizer=rowwise_adagrad "
            "--embeddings=merlin",
        ),
        (["--exchange-dtype", "int8"], "argument --exchange-dtype: invalid choice: 'int8'"),
        (
            ["--exchange-dtype", "float16", "--backend", "distributed-embeddings"],
            "--exchange-dtype needs --backend horovod or auto. Received: --exchange-dtype=float16 "
            "--backend=distributed-embeddings",
        ),
        (
            ["--backend", "distributed-embeddings"],
            "--backend distributed-embeddings places with basic, memory_balanced, "
            "memory_optimized only. Received: --strategy=work_balanced",
        ),
        pytest.param(
            ["--backend", "distributed-embeddings", "--strategy", "memory_optimized"],
            "needs NVIDIA distributed-embeddings",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("distributed_embeddings") is not None,
                reason="distributed-embeddings is installed",
            ),
        ),
    ],
)
def test_bad_options_exit_2_with_one_line_before_tensorflow(argv, message, capsys):
    had_tf = "tensorflow" in sys.modules
    try:
        code = dlrm_main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and message in err[0], err
    assert had_tf or "tensorflow" not in sys.modules


def test_train_dir_without_schema_is_refused(tmp_path, capsys):
    (tmp_path / "part.parquet").write_bytes(b"")
    assert dlrm_main(["--train-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--train-dir has no Merlin schema" in err and str(tmp_path) in err


def test_a_train_dir_with_a_schema_only_exits_2_naming_it(tmp_path, capsys):
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    from merlin_models_de.apps.common.schemas import synthetic_schema

    schema = synthetic_schema("criteo")
    TensorflowMetadata.from_merlin_schema(schema).to_proto_text_file(str(tmp_path))
    assert dlrm_main(["--train-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: --train-dir holds no .parquet files (only its schema?). "
        f"Received: --train-dir={str(tmp_path)!r}"
    ], err


def test_synthetic_rows_do_not_depend_on_world_size():
    from merlin_models_de.apps.common.schemas import synthetic_schema

    schema = synthetic_schema("criteo")
    assert rank_rows(10, per_rank=2, world_size=2, rank=1) == [(2, 4), (6, 8)]
    whole = make_rows(schema, rank_rows(70000, 1000, 1, 0), seed=3)
    parts = [make_rows(schema, rank_rows(70000, 500, 2, r), seed=3) for r in range(2)]
    for name in ("C1", "I1", "label"):
        # global batch k = rank 0's k-th batch, then rank 1's
        glued = np.concatenate(
            [np.concatenate([p[name][k * 500 : (k + 1) * 500] for p in parts]) for k in range(70)]
        )
        np.testing.assert_array_equal(glued, whole[name])
    assert whole["C1"].max() < 10_000_000 and 0.2 < whole["label"].mean() < 0.8


@pytest.mark.full  # resume: also test_resume_after_a_mid_epoch_kill_trains_each_batch_once
def test_single_process_run_checkpoint_and_resume(tmp_path):
    # --export (model.save of the trained model, ~95 s of Keras tracing for these 26 tables)
    # is run by tests/unit/test_serving_ensemble.py, which serves what the command exported
    ckpt = str(tmp_path / "ckpt")
    # the first run as a user starts it: no --quiet, no logging variables (what it prints
    # is check_plain_run_output's)
    plain = {
        k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")
    }
    first = _run(
        [
            "--rows",
            "1024",
            "--epochs",
            "2",
            "--checkpoint-dir",
            ckpt,
            *[a for a in QUICK if a != "--quiet"],
        ],
        env=plain,
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    check_plain_run_output(first)
    # the default strategy, work_balanced, is the horovod backend's only: auto picks it
    assert "backend=horovod\n" in first.stdout and "epoch 2:" in first.stdout
    report = json.load(open(os.path.join(ckpt, "report.json"), encoding="utf-8"))
    assert [e["epoch"] for e in report["epochs"]] == [1, 2]
    assert report["steps_per_epoch"] == 16 and report["world_size"] == 1
    assert report["horovod_cycle_time_ms"] is None  # no Horovod in one process
    assert report["epochs"][0]["embedding_bytes"] == [report["total_embedding_bytes"]]
    assert 0.0 <= report["epochs"][1]["val_auc"] <= 1.0
    assert report["time_to_first_step"] > 0 and report["warm_samples_per_second"] > 0
    # the host's (stolen, all) CPU ticks while each epoch trained, and the warm share stolen
    ((stolen, ticks),) = report["epochs"][1]["host_cpu_ticks"]
    assert 0 <= stolen <= ticks and ticks > 0
    assert report["warm_host_steal_share"] == pytest.approx(stolen / ticks)
    resumed = _run(["--rows", "1024", "--epochs", "3", "--checkpoint-dir", ckpt, *QUICK])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stdout and "(step 32, epoch 2)" in resumed.stdout
    again = json.load(open(os.path.join(ckpt, "report.json"), encoding="utf-8"))
    assert [e["epoch"] for e in again["epochs"]] == [3]


@pytest.mark.full  # 2 ranks of the command: also test_checkpoint_faults.py and the horovod stage
def test_two_ranks_hold_half_the_tables_each(tmp_path):
    report_path = str(tmp_path / "r.json")
    run = _run(
        [
            "--rows",
            "2048",
            "--epochs",
            "2",
            "--report",
            report_path,
            "--strategy",
            "memory_balanced",
            "--steps-per-execution",
            "5",
            "--input",
            "loader",
            *QUICK,
        ],
        ranks=2,
    )  # the other runs feed tf.data
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("epoch 2:") == 1  # rank 0 reports
    report = json.load(open(report_path, encoding="utf-8"))
    assert report["world_size"] == 2 and report["global_batch"] == 128
    if len(os.sched_getaffinity(0)) >= 2 and "HOROVOD_CYCLE_TIME" not in os.environ:
        assert report["horovod_cycle_time_ms"] == 0.2  # bound ranks: apps/common/cores.py
    # 16 steps an epoch in executions of 5 (5, 5, 5, 1): every step counted once
    assert [e["steps"] for e in report["epochs"]] == [16, 16]
    assert len(report["warm_step_times"]) == 16
    per_rank = report["epochs"][-1]["embedding_bytes"]
    assert sum(per_rank) == report["total_embedding_bytes"]
    assert max(per_rank) <= 0.55 * report["total_embedding_bytes"]
    assert len(report["epochs"][-1]["peak_rss_bytes"]) == 2
    # each rank started itself again on 2 MB pages (apps/common/huge_pages.py)
    on_huge_pages = report["epochs"][-1]["huge_page_bytes"]
    if relaunch_env({}, thp_mode(), glibc_version()) is not None:
        assert len(on_huge_pages) == 2 and min(on_huge_pages) >= 64 << 20, on_huge_pages
    # each rank's training CPU (user, kernel) per epoch, and the warm epochs' per 1,000 samples
    assert [len(c) for c in report["epochs"][-1]["cpu_seconds"]] == [2, 2]
    cpu = report["warm_cpu_per_1000_samples"]
    assert cpu["user"] > 0 and cpu["system"] >= 0
    assert cpu["user"] + cpu["system"] == pytest.approx(
        1000 * sum(map(sum, report["epochs"][1]["cpu_seconds"])) / (16 * 128)
    )
    # each rank's host (one here): the hypervisor's share of its CPU while epoch 2 trained
    ticks = report["epochs"][1]["host_cpu_ticks"]
    assert len(ticks) == 2 and report["warm_host_steal_share"] == pytest.approx(
        max(stolen / total for stolen, total in ticks)
    )


def test_two_ranks_bad_option_one_line(tmp_path):
    run = _run(["--strategy", "fastest"], ranks=2, timeout=300)
    assert run.returncode != 0
    lines = [l for l in (run.stdout + run.stderr).splitlines() if "invalid choice" in l]
    assert len(lines) == 1, run.stdout + run.stderr
    # the ranks exit 2 quietly; the only traceback is horovodrun's own (it raises on any
    # non-zero rank), never a rank's
    ranks_out = [l for l in (run.stdout + run.stderr).splitlines() if l.startswith("[")]
    assert not [l for l in ranks_out if "Traceback" in l], ranks_out
    assert "exit with status code 2" in run.stdout


@pytest.mark.parametrize(
    "argv, host_dependent",
    [
        (["--strategy", "fastest"], False),
        (["--learning-rate", "inf"], False),
        (["--train-dir", "/no/such/dir"], True),
    ],
)
def test_every_rank_exits_2_and_each_host_names_its_own_problem(argv, host_dependent):
    # ranks as horovodrun starts them on two hosts (a: ranks 0, 1; b: ranks 2, 3)
    for rank, local_rank, host in ((0, 0, "a"), (1, 1, "a"), (2, 0, "b"), (3, 1, "b")):
        env = dict(
            ENV,
            HOROVOD_RANK=str(rank),
            HOROVOD_SIZE="4",
            HOROVOD_HOSTNAME=host,
            HOROVOD_LOCAL_RANK=str(local_rank),
            HOROVOD_LOCAL_SIZE="2",
        )
        out = subprocess.run(
            [sys.executable, "-m", "merlin_models_de.apps.dlrm", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and "Traceback" not in out.stderr, (rank, out.stderr)
        speaks = rank == 0 or (host_dependent and local_rank == 0)
        assert len(lines) == (1 if speaks else 0), (rank, lines)
        if speaks and rank:
            assert lines[0].startswith(f"error (rank {rank}, host {host}): --train-dir"), lines


def test_unknown_dataset_exits_2_before_tensorflow_loads():
    code = (
        "import sys\nfrom merlin_models_de.apps.dlrm.__main__ import main\n"
        "code = main(['--dataset', 'nosuch'])\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow loaded'\nsys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        check=False,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert "--dataset must name a Merlin synthetic dataset (" in lines[0]
    assert "criteo" in lines[0] and lines[0].endswith("Received: --dataset='nosuch'")


def _checkpoints(directory):
    """{step: name} of the complete checkpoints in ``directory``."""
    out = {}
    for name in os.listdir(directory):
        manifest = os.path.join(directory, name, "manifest.json")
        if name.startswith("ckpt-") and os.path.isfile(manifest):
            out[json.load(open(manifest, encoding="utf-8"))["step"]] = name
    return out


def test_resume_after_a_mid_epoch_kill_trains_each_batch_once(tmp_path):
    from merlin_models_de.persistence.checkpoint import latest_checkpoint, read_full_tables

    # 1024 rows / batch 64 = 16 steps per epoch, 3 epochs = 48 steps
    common = ["--rows", "1024", "--epochs", "3", "--valid-rows", "0", "--seed", "7", *QUICK]
    ref_dir, ckpt = str(tmp_path / "ref"), str(tmp_path / "ckpt")
    ref = _run([*common, "--checkpoint-dir", ref_dir])
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    killed = subprocess.run(
        [
            sys.executable,
            os.path.join("tests", "scripts", "dlrm_killed.py"),
            "24",
            *common,
            "--checkpoint-dir",
            ckpt,
            "--checkpoint-every",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert killed.returncode == -9, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert max(_checkpoints(ckpt)) == 24  # killed in epoch 2, after 8 of its 16 batches
    # resumed with a clean environment: no import noise may reach the user either
    env = {k: v for k, v in ENV.items() if k not in ("PYTHONWARNINGS", "TF_CPP_MIN_LOG_LEVEL")}
    resumed = _run(
        [*common, "--checkpoint-dir", ckpt, "--checkpoint-every", "8", "--checkpoint-keep", "2"],
        env=env,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "(step 24, epoch 1; epoch 2 goes on after its first 8 of 16 batches)" in resumed.stdout
    report = json.load(open(os.path.join(ckpt, "report.json"), encoding="utf-8"))
    assert [(e["epoch"], e["steps"]) for e in report["epochs"]] == [(2, 8), (3, 16)]
    assert report["resumed"]["step"] == 24 and report["resumed"]["skipped_batches"] == 8
    # epochs x steps optimizer steps in all (not 56), and --checkpoint-keep 2 kept two
    assert sorted(_checkpoints(ckpt)) == [40, 48]
    # the same batches in the same order as the uninterrupted run: the same tables
    got = read_full_tables(latest_checkpoint(ckpt))
    want = read_full_tables(latest_checkpoint(ref_dir))
    assert want and {b: sorted(t) for b, t in got.items()} == {
        b: sorted(t) for b, t in want.items()
    }
    for block, tables in want.items():
        for table, parts in tables.items():  # the table and its Adagrad accumulator
            for part, array in parts.items():
                np.testing.assert_allclose(
                    got[block][table][part], array, rtol=1e-4, atol=1e-6, err_msg=f"{table} {part}"
                )
    noise = (
        "UserWarning",
        "dtype mappings did not load",
        "NVTabular Dataset in CPU mode",
        "I tensorflow/",
        "Please fix your imports",
    )
    assert not [
        l for l in resumed.stderr.splitlines() if any(n in l for n in noise)
    ], resumed.stderr[-3000:]


@pytest.mark.full  # equal steps: also horovod/test_data_rules.py and test_errors.py
def test_parquet_dir_with_unequal_partitions_takes_equal_steps(tmp_path):
    from merlin.io import Dataset

    from merlin_models_de.apps.common.schemas import synthetic_schema
    from merlin_models_de.apps.common.synthetic import capped_schema, make_rows

    schema = capped_schema(synthetic_schema("criteo"), 1000)
    import pandas as pd

    for name, rows in (("train", 1500), ("valid", 600)):
        frame = pd.DataFrame(make_rows(schema, [(0, rows)], seed=5))
        ds = Dataset(frame, schema=schema, npartitions=3)  # 500 rows each
        ds.to_parquet(str(tmp_path / name))
    report_path = str(tmp_path / "r.json")
    run = _run(
        [
            "--train-dir",
            str(tmp_path / "train"),
            "--valid-dir",
            str(tmp_path / "valid"),
            "--report",
            report_path,
            *QUICK,
        ],
        ranks=2,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.load(open(report_path, encoding="utf-8"))
    # 3 partitions on 2 ranks: 1000 and 500 rows -> 15 and 7 batches of 64; both take 7
    assert report["steps_per_epoch"] == 7
    assert "train batches per rank differ [15, 7]" in run.stdout


def test_dynamic_tables_report_their_keys_each_epoch(tmp_path):
    """--dynamic: C1's ids get rows as they arrive; each epoch's line and the report say how
    many keys hold a row, were admitted and evicted (C2: a capacity below its ids, so it
    evicts)."""
    report_path = str(tmp_path / "r.json")
    argv = ["--rows", "1024", "--epochs", "2", "--report", report_path, *QUICK]
    run = _run([*argv, "--dynamic", "C1", "--dynamic", "C2=16", "--evict", "lru"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.load(open(report_path, encoding="utf-8"))
    first, second = (e["dynamic_tables"] for e in report["epochs"])
    assert first["C1"]["keys"] == first["C1"]["admitted"] > 0 and first["C1"]["evicted"] == 0
    assert second["C1"]["keys"] == first["C1"]["keys"]  # the same rows: epoch 2 adds no key
    assert first["C2"]["keys"] == 16 and first["C2"]["evicted"] > 0
    c1 = first["C1"]["keys"]
    assert f"C1: {c1:,} keys ({c1:,} admitted, 0 evicted)" in run.stdout
