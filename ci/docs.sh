#!/usr/bin/env bash
# Runs every python / bash code block of README.md and docs/*.md as written
# (tests/unit/test_docs.py; about 20 minutes on 2 cores: the blocks train real models).
# Kept out of ci/test.sh until its cost fits CI's budget.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash ci/setup.sh || { echo "[docs] setup failed"; exit 1; }
source .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}" PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
exec timeout --kill-after=30 3600 python -m pytest tests/unit/test_docs.py -p no:cacheprovider \
  -q -rs "$@"
