"""Importing the package has no side effects on Horovod or devices; world size 1 without horovodrun."""

import os
import subprocess
import sys

CHECK = """
import sys
import merlin_models_de
import merlin_models_de.planner, merlin_models_de.tables, merlin_models_de.comm
assert 'tensorflow' not in sys.modules and 'merlin.models.tf' not in sys.modules
import horovod.tensorflow as hvd
assert not hvd.is_initialized(), 'import initialized Horovod'
if 'tensorflow' in sys.modules:
    from tensorflow.python.eager import context
    assert not context.context()._initialized, 'import initialized TF devices'
print('clean')
"""


def test_import_does_not_init_horovod_or_devices_even_under_horovodrun_env():
    env = dict(os.environ, HOROVOD_RANK="0", HOROVOD_SIZE="1", PYTHONWARNINGS="ignore")
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("clean")


def test_registration_follows_merlin_import_in_either_order():
    for order in (
        "import merlin_models_de; import merlin.models.tf as mm",
        "import merlin.models.tf as mm; import merlin_models_de",
    ):
        code = (
            f"{order}; from merlin_models_de.block.layer import DistributedEmbeddings as D;"
            "import merlin_models_de as m; m.register();"
            "print(mm.DistributedEmbeddings is D is m.DistributedEmbeddings)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )
        assert out.stdout.strip().endswith("True"), out.stderr[-2000:]


def test_planner_tables_and_exchange_options_import_no_tensorflow():
    # the commands check their options (backends/options.py) before TensorFlow loads
    code = (
        "import sys, merlin_models_de.planner, merlin_models_de.tables;"
        "import merlin_models_de.backends.options;"
        "print('tensorflow' in sys.modules, 'horovod' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


def test_single_process_is_world_size_one():
    from merlin_models_de import comm

    assert (comm.size(), comm.rank()) == (1, 0)
    assert comm.allgather_object("x") == ["x"]
