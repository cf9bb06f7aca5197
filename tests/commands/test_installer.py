"""scripts/install_distributed_embeddings.sh stops with a clear message when a prerequisite is
missing (here: the CPU-only TensorFlow of this stack, or nvcc), and never half-installs."""

import os
import subprocess
import sys

import pytest

from merlin_models_de.backends.registry import is_importable

SCRIPT = os.path.join(
    os.path.dirname(__file__), "..", "..", "scripts", "install_distributed_embeddings.sh"
)
pytestmark = pytest.mark.skipif(
    is_importable("distributed-embeddings"), reason="distributed-embeddings is installed here"
)


def _run(path_dirs, **env):
    env = dict(os.environ, PATH=os.pathsep.join(path_dirs), PYTHON=sys.executable, **env)
    return subprocess.run(
        ["bash", SCRIPT], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_without_nvcc_it_names_nvcc():
    dirs = [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    if any(os.path.exists(os.path.join(d, "nvcc")) for d in dirs):
        pytest.skip("nvcc lives in a system directory here")
    run = _run(dirs, CUDA_HOME="/nonexistent")
    assert run.returncode == 1
    assert "nvcc not found on PATH or in CUDA_HOME=/nonexistent" in run.stderr


def test_with_a_cpu_only_tensorflow_it_says_so(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    nvcc = fake / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8'\n")
    nvcc.chmod(0o755)
    run = _run([str(fake), os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    assert run.returncode == 1
    assert "CPU-only build (tensorflow-cpu); DE needs the GPU build" in run.stderr
    assert "Cloning" not in run.stderr + run.stdout  # it stopped before cloning anything
