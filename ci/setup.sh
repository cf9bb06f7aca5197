#!/usr/bin/env bash
# Idempotent setup: creates .venv in the repo, installs the pinned stack, builds Horovod
# 0.28.1 against the installed TensorFlow with Gloo, installs this package (editable).
# Fails loudly if `horovodrun --check-build` does not list TensorFlow and Gloo (and MPI where
# OpenMPI is installed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
VENV="$ROOT/.venv"
STAMP="$VENV/.merlin-models-de-setup"

# Debian packages the tests need, installed where missing (root and apt-get only; without them
# the tests that need them skip, saying why):
# - openssh-server: the multi-host tests start an sshd inside each network-namespace "host";
# - openmpi-bin, libopenmpi-dev: Horovod is built with MPI as well as Gloo, so `mpirun`,
#   `horovodrun --mpi` and SLURM's `srun` can start ranks (docs/multihost.md);
# - slurmctld, slurmd, slurm-client, munge: the SLURM cluster on the namespace hosts
#   (scripts/slurm_hosts.sh).
apt_install() {  # $1 = the file that tells it is there, then the packages
  local marker="$1"; shift
  [[ -e "$marker" || $(id -u) -ne 0 ]] && return 0
  command -v apt-get >/dev/null || return 0
  echo "[setup] installing $* (Debian)"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             --no-install-recommends "$@"; }; } >/dev/null \
    || echo "[setup] $* did not install: the tests that need them will skip"
}
apt_install /usr/sbin/sshd openssh-server
apt_install /usr/bin/mpicxx openmpi-bin libopenmpi-dev
apt_install /usr/sbin/slurmd slurmctld slurmd slurm-client munge
REQ_HASH="$(cat ci/requirements.txt ci/setup.sh pyproject.toml | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$REQ_HASH" ]]; then
  echo "[setup] .venv is up to date"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
# pip < 24: merlin-dataloader 23.8 declares a direct-URL dependency that pip 24+ rejects.
python -m pip install --quiet "pip<24" "setuptools<70" wheel
python -m pip install --quiet -r ci/requirements.txt

# Horovod is built from source against the installed TensorFlow (a few minutes on 2 cores).
# The wheel is kept in a per-user cache keyed by everything its ABI depends on (Horovod,
# TensorFlow and Python versions, the build flags), so a second clean clone on the same machine
# installs it in seconds; any change of those builds a new one.
# No [tensorflow] extra and --no-deps: the extra asks for the `tensorflow` distribution, which
# pip would fetch at its newest (with NumPy 2) on top of tensorflow-cpu. Its few plain
# dependencies are pinned in ci/requirements.txt.
# With MPI where OpenMPI's compiler wrapper is here (horovodrun --gloo still picks Gloo, and a
# process that horovodrun did not start stays a plain process until Horovod is initialized).
HVD_MPI=HOROVOD_WITHOUT_MPI=1
command -v mpicxx >/dev/null && HVD_MPI=HOROVOD_WITH_MPI=1
HVD_FLAGS=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 "$HVD_MPI"
           HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
WANT_MPI=False; [[ "$HVD_MPI" == HOROVOD_WITH_MPI=1 ]] && WANT_MPI=True
# (re)built where missing or where its MPI does not match (OpenMPI installed after it was built)
if ! python -c "import sys, horovod.tensorflow as h; sys.exit(h.mpi_built() != $WANT_MPI)" \
    2>/dev/null; then
  TF_VERSION="$(python -c 'import tensorflow as tf; print(tf.__version__)')"
  HVD_KEY="$(echo "horovod-0.28.1 tf-$TF_VERSION $(python -c 'import sys; print(sys.version)') ${HVD_FLAGS[*]}" \
             | sha256sum | cut -c1-16)"
  HVD_CACHE="${MMDE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/merlin-models-de/wheels}/$HVD_KEY"
  if ! compgen -G "$HVD_CACHE/horovod-*.whl" >/dev/null; then
    echo "[setup] building horovod 0.28.1 against TensorFlow $TF_VERSION (a few minutes)"
    mkdir -p "$HVD_CACHE.partial"
    env "${HVD_FLAGS[@]}" MAKEFLAGS="-j$(nproc)" \
      python -m pip wheel --no-cache-dir --no-build-isolation --no-deps \
        -w "$HVD_CACHE.partial" "horovod==0.28.1"
    rm -rf "$HVD_CACHE" && mv "$HVD_CACHE.partial" "$HVD_CACHE"  # complete wheels only
  else
    echo "[setup] horovod 0.28.1 for TensorFlow $TF_VERSION from $HVD_CACHE"
  fi
  python -m pip install --force-reinstall --no-deps "$HVD_CACHE"/horovod-*.whl
fi

CHECK="$(horovodrun --check-build)"
echo "$CHECK"
python - "$CHECK" <<'PY'
import re, sys
text = sys.argv[1]
def on(name):
    m = re.search(r"\[(X| )\]\s*" + name, text)
    return bool(m and m.group(1) == "X")
import shutil
wanted = ("TensorFlow", "Gloo") + (("MPI",) if shutil.which("mpicxx") else ())
missing = [n for n in wanted if not on(n)]
if missing:
    sys.exit(f"[setup] FAILED: horovodrun --check-build does not list {missing}")
PY

python -m pip install --quiet --no-deps -e .
python -c "import merlin_models_de, merlin.models.tf, horovod.tensorflow; print('[setup] imports ok')"
echo "$REQ_HASH" > "$STAMP"
echo "[setup] done"
