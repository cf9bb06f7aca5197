"""What the commands call themselves (the name the user typed, in usage and error lines) and
how they refuse a dataset directory whose parquet files hold no rows."""

import os
import subprocess
import sys

import pytest

from merlin_models_de.apps.common.program import console_scripts, program_name
from merlin_models_de.apps.dlrm.__main__ import main as dlrm_main
from merlin_models_de.apps.next_item.__main__ import main as next_item_main
from tests.commands.launch import QUIET_ENV as ENV

BIN = os.path.dirname(sys.executable)
# console script -> the module ``python -m`` runs for the same command
COMMANDS = {
    "mmde-dlrm": "merlin_models_de.apps.dlrm",
    "mmde-next-item": "merlin_models_de.apps.next_item",
    "mmde-plan": "merlin_models_de.apps.tools.plan",
    "mmde-bench": "merlin_models_de.apps.bench",
}


def _help(cmd):
    out = subprocess.run(
        [*cmd, "--help"], capture_output=True, text=True, timeout=120, env=ENV, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()[0]


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_usage_names_the_console_script_the_user_typed(script):
    path = os.path.join(BIN, script)
    if not os.path.exists(path):
        pytest.skip(f"{script} is not installed in this environment ({BIN})")
    assert _help([path]).startswith(f"usage: {script} "), script


@pytest.mark.parametrize("script", ["mmde-dlrm", "mmde-plan"])
def test_usage_names_the_module_when_started_with_python_m(script):
    module = COMMANDS[script]
    assert _help([sys.executable, "-m", module]).startswith(f"usage: python -m {module} ")


def test_program_name_is_the_console_script_only_when_it_is_this_packages():
    installed = console_scripts()
    assert installed <= set(COMMANDS), installed  # every console script is tested above
    for script in installed:
        assert program_name(COMMANDS[script], [f"/venv/bin/{script}"]) == script
    module = COMMANDS["mmde-dlrm"]
    for argv0 in ("/x/merlin_models_de/apps/dlrm/__main__.py", "pytest", "", "-c"):
        assert program_name(module, [argv0]) == f"python -m {module}", argv0


def _empty_parquet_dir(directory, schema_name="criteo"):
    """A directory holding a Merlin schema and a parquet file with its columns and no rows."""
    import pandas as pd
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    from merlin_models_de.apps.common.schemas import synthetic_schema

    schema = synthetic_schema(schema_name)
    directory.mkdir(parents=True, exist_ok=True)
    TensorflowMetadata.from_merlin_schema(schema).to_proto_text_file(str(directory))
    columns = {c.name: pd.Series([], dtype="int64") for c in schema}
    pd.DataFrame(columns).to_parquet(directory / "part_0.parquet")
    return directory


def test_dlrm_on_a_zero_row_parquet_dir_exits_2_with_one_line_naming_it(tmp_path, capsys):
    train = _empty_parquet_dir(tmp_path / "train")
    assert dlrm_main(["--train-dir", str(train)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --train-dir holds no rows: its 1 .parquet file(s) are empty. "
        f"Received: --train-dir={str(train)!r}"
    ], err


def test_next_item_on_a_zero_row_parquet_dir_exits_2_naming_it(tmp_path, capsys):
    train = _empty_parquet_dir(tmp_path / "train", "sequence-testing")
    code = next_item_main(["--train-dir", str(train), "--valid-dir", str(train)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: --train-dir holds no rows") and repr(str(train)) in err[0]


def test_a_file_that_is_not_parquet_is_named(tmp_path, capsys):
    train = _empty_parquet_dir(tmp_path / "train")
    (train / "part_1.parquet").write_bytes(b"not parquet")
    assert dlrm_main(["--train-dir", str(train)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --train-dir holds a file that is not"), err
    assert repr(str(train / "part_1.parquet")) in err[0]
