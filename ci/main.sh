#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, then train DLRM with DistributedEmbeddings
# under horovodrun on 2 local ranks: synthetic Criteo (26 tables, 45.6M rows, dim 16),
# memory_optimized placement with column slices above 2**24 elements, Adagrad, 2 epochs of
# 100k rows, per-rank batch 512. Prints the placement, per-epoch samples/s, loss, validation
# AUC / logloss and per-rank memory; the JSON report lands in runs/dlrm/report.json.
# Environment: NP (ranks, default 2), HOSTS (horovodrun -H, default localhost:NP), ROWS,
# NIC (the interface ranks talk over, default lo: set it, e.g. NIC=eth0, together with HOSTS).
# Extra arguments go to the DLRM command (python -m merlin_models_de.apps.dlrm --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
source .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONWARNINGS=ignore
NP="${NP:-2}"
rm -rf runs/dlrm
timeout 1800 horovodrun --gloo -np "$NP" -H "${HOSTS:-localhost:$NP}" --network-interface "${NIC:-lo}" \
  python -m merlin_models_de.apps.dlrm --rows "${ROWS:-100000}" --epochs 2 --batch-size 512 \
  --dim 16 --optimizer adagrad --strategy memory_optimized --column-slice-threshold 16777216 \
  --report runs/dlrm/report.json "$@"
