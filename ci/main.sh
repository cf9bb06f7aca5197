#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, then show the placement of synthetic Criteo
# (26 tables, 45.6M rows, dim 16) on 2 ranks. Extra arguments go to the plan command.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
source .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONWARNINGS=ignore
python -m merlin_models_de.plan criteo --world-size 2 --strategy memory_optimized \
  --column-slice-threshold 16777216 --dim 16 --optimizer adagrad --device-memory 2GB "$@"
