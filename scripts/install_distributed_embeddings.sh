#!/usr/bin/env bash
# Installs NVIDIA distributed-embeddings (DE) into the active Python environment, from its
# official repository at a pinned commit, with upstream's documented build (clone, init the
# submodules, `make pip_pkg`, pip install the wheel). For GPU machines: DE's kernels need nvcc
# and a GPU build of TensorFlow. Safe to run twice (does nothing when the pinned DE imports).
#
# Usage: bash scripts/install_distributed_embeddings.sh   (inside the venv that trains)
# Environment: DE_COMMIT (default: the pin below), DE_SRC (build directory, default a temp dir),
#              CUDA_HOME (default /usr/local/cuda).
set -euo pipefail

# 45cffaa (2023-09-05): the newest commit that runs on TF 2.12 in graph mode; later ones use
# zip(..., strict=True) inside autograph-converted code, which TF 2.12 rejects.
DE_COMMIT="${DE_COMMIT:-45cffaa}"
DE_REPO="https://github.com/NVIDIA-Merlin/distributed-embeddings.git"
TF_WANTED="2.12"
PYTHON="${PYTHON:-python}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

die() { echo "install_distributed_embeddings: $*" >&2; exit 1; }

if "$PYTHON" - <<'EOF' 2>/dev/null
import distributed_embeddings.python.layers.dist_model_parallel  # noqa: F401
EOF
then
  echo "distributed-embeddings already imports in $("$PYTHON" -c 'import sys; print(sys.prefix)'); nothing to do."
  exit 0
fi

# ---- prerequisites, each with a clear message --------------------------------------------
command -v git >/dev/null || die "git is missing (needed to clone $DE_REPO)."
command -v make >/dev/null || die "make is missing."
command -v g++ >/dev/null || die "g++ is missing (DE's host code is C++17)."
NVCC="$(command -v nvcc || true)"
[ -n "$NVCC" ] || [ -x "$CUDA_HOME/bin/nvcc" ] || die "nvcc not found on PATH or in CUDA_HOME=$CUDA_HOME. DE's kernels are CUDA: install the CUDA toolkit that matches your TensorFlow (TF 2.12: CUDA 11.8) or set CUDA_HOME."
[ -n "$NVCC" ] || export PATH="$CUDA_HOME/bin:$PATH"
TF_INFO="$("$PYTHON" - 2>/dev/null <<'EOF' || true
import tensorflow as tf
print(tf.__version__, int(tf.test.is_built_with_cuda()))
EOF
)"
[ -n "$TF_INFO" ] || die "TensorFlow does not import with $PYTHON. Install tensorflow==2.12.1 (the GPU build) first."
read -r TF_VERSION TF_CUDA <<<"$TF_INFO"
case "$TF_VERSION" in
  "$TF_WANTED".*) ;;
  *) die "TensorFlow $TF_VERSION found; this pin of DE is for TensorFlow $TF_WANTED (pip install tensorflow==2.12.1)." ;;
esac
[ "$TF_CUDA" = "1" ] || die "TensorFlow $TF_VERSION here is a CPU-only build (tensorflow-cpu); DE needs the GPU build: pip install tensorflow==2.12.1."
"$PYTHON" -c "import horovod.tensorflow" 2>/dev/null || die "Horovod with TensorFlow support does not import. Build it first (README: HOROVOD_WITH_TENSORFLOW=1 HOROVOD_GPU_OPERATIONS=NCCL pip install --no-build-isolation --no-deps horovod==0.28.1)."

# ---- upstream's build ---------------------------------------------------------------------
SRC="${DE_SRC:-$(mktemp -d)/distributed-embeddings}"
if [ ! -d "$SRC/.git" ]; then
  git clone "$DE_REPO" "$SRC"
fi
git -C "$SRC" fetch --quiet origin
git -C "$SRC" checkout --quiet "$DE_COMMIT"
git -C "$SRC" submodule update --init --recursive
make -C "$SRC" clean >/dev/null 2>&1 || true
make -C "$SRC" pip_pkg PYTHON_BIN_PATH="$PYTHON"
WHEEL="$(ls -t "$SRC"/artifacts/*.whl 2>/dev/null | head -1)"
[ -n "$WHEEL" ] || die "the build produced no wheel in $SRC/artifacts (see make's output above)."
"$PYTHON" -m pip install --no-deps --force-reinstall "$WHEEL"
"$PYTHON" -c "import distributed_embeddings.python.layers.dist_model_parallel" \
  || die "installed $WHEEL, but it does not import."
echo "distributed-embeddings $DE_COMMIT installed; backend='auto' now picks it."
