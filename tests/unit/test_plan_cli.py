"""The `python -m merlin_models_de.plan` command, run as a real subprocess."""
import os
import subprocess
import sys

import pytest

from merlin_models_de.apps.plan import parse_bytes


def run(*args):
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "merlin_models_de.plan", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_criteo_plan_and_device_memory():
    out = run("criteo", "--world-size", "4", "--strategy", "memory_optimized",
              "--column-slice-threshold", str(2**24), "--dim", "16", "--optimizer", "adagrad",
              "--device-memory", "1GB")
    assert out.returncode == 0, out.stderr
    assert "ShardingPlan: 26 tables, world_size=4, strategy=memory_optimized" in out.stdout
    assert "optimizer=adagrad (+1 slot copies)" in out.stdout
    # 45.6M rows * 16 * 4 B * 2 (adagrad) = 5.84 GB: at least 6 ranks of 1 GB
    line = [l for l in out.stdout.splitlines() if l.startswith("Smallest world size")][0]
    assert int(line.split(": ")[1].split()[0]) >= 6


def test_schema_file_and_dataset_directory(tmp_path, synthetic_schema):
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    TensorflowMetadata.from_merlin_schema(synthetic_schema("music-streaming")).to_proto_text_file(
        str(tmp_path))
    for source in (str(tmp_path), str(tmp_path / "schema.pbtxt")):
        out = run(source, "--world-size", "2", "--dim", "8")
        assert out.returncode == 0, out.stderr
        assert "world_size=2, strategy=basic" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["criteo", "--world-size", "0"], "Received: world_size=0"),
    (["criteo", "--column-slice-threshold", "-1"], "Received: column_slice_threshold=-1"),
    (["no-such-dataset"], "Received: schema='no-such-dataset'"),
    (["criteo", "--device-memory", "lots"], "Received: --device-memory='lots'"),
])
def test_bad_options_exit_non_zero_with_a_clear_line(args, message):
    out = run(*args)
    assert out.returncode == 2 and message in out.stderr


def test_parse_bytes():
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("512") == 512
