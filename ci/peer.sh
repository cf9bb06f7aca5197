#!/usr/bin/env bash
# Peer stage: Merlin Models 23.8.0's own tests with every mm.Embeddings(...) replaced by
# mm.DistributedEmbeddings(...) with the same arguments (pytest plugin tests/peer/mmde_swap.py).
#   1. downloads the merlin-models 23.8.0 sdist from PyPI (once; cached in .cache/peer, checked
#      against its sha256) and extracts its tests/ and pytest.ini;
#   2. runs tests/peer/selection.txt in one process, then tests/peer/selection_hvd.txt under
#      horovodrun -np 2; tests/peer/xfail.txt lists the expected failures with their reasons.
#      Lines marked "# full: <seconds>" (the costliest tests) run only with MMDE_FULL=1
#      (`bash ci/test.sh --full`): CI runs the rest;
#   3. prints per-file counts (passed / failed / xfailed ...) for both.
# Each run has a timeout and each test a watchdog: a hang fails the stage and prints the rank
# and the test it was stuck in. Exit code 0 only if both runs and their checks pass.
# Environment: PEER_TIMEOUT_1 / PEER_TIMEOUT_2 (s, whole run), MMDE_TEST_TIMEOUT (s, one test).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[[ -x .venv/bin/python ]] || bash ci/setup.sh || { echo "[peer] setup failed"; exit 1; }
source .venv/bin/activate

VERSION=23.8.0
SDIST_SHA256=45321bd5dc453afb43127678d88a3c5c84da6ce6b7509bf0302971bcf3186345
PEER="$ROOT/tests/peer"
CACHE="$ROOT/.cache/peer"
TESTS="$CACHE/merlin-models-$VERSION"   # tests/ and pytest.ini of the sdist, nothing else
OUT="$CACHE/last-run"
FULL="${MMDE_FULL:-0}"
# measured, CI tier: one process 90 tests, 163 s of tests; 2 ranks 29 tests, ~190 s + Merlin's
# own horovod tests ~150 s. Full: 1,067 s in one pytest process (124 tests); 2 ranks ~530 s.
T1="${PEER_TIMEOUT_1:-$([[ $FULL == 1 ]] && echo 1500 || echo 600)}"
T2="${PEER_TIMEOUT_2:-$([[ $FULL == 1 ]] && echo 1200 || echo 700)}"
# one test's watchdog: Merlin's horovod DLRM test saves 26 tables (126 s measured on 2 ranks)
export MMDE_TEST_TIMEOUT="${MMDE_TEST_TIMEOUT:-300}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}" PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"
# the plugin and the stubs of Merlin's test-only imports (asvdb, git, fiddle); the tests run
# from $TESTS, not the sdist root, so `import merlin` is the installed package
export PYTHONPATH="$PEER:$PEER/stubs${PYTHONPATH:+:$PYTHONPATH}"
export MMDE_SWAP=on MMDE_OUT="$OUT" MMDE_XFAIL="$PEER/xfail.txt"

fetch_tests() {
  [[ -f "$TESTS/pytest.ini" && -d "$TESTS/tests/unit/tf" ]] && return 0
  local dl="$CACHE/sdist" tarball="$CACHE/sdist/merlin-models-$VERSION.tar.gz" tmp="$CACHE/tmp.$$"
  mkdir -p "$dl"
  if [[ ! -f "$tarball" ]]; then
    echo "[peer] downloading the merlin-models $VERSION sdist"
    python -m pip download --quiet --no-deps --no-binary :all: "merlin-models==$VERSION" -d "$dl" \
      || { echo "[peer] pip download of merlin-models==$VERSION failed"; return 1; }
  fi
  local got; got="$(sha256sum "$tarball" | cut -d' ' -f1)"
  if [[ "$got" != "$SDIST_SHA256" ]]; then
    echo "[peer] $tarball: sha256 $got, expected $SDIST_SHA256"; rm -f "$tarball"; return 1
  fi
  rm -rf "$tmp" && mkdir -p "$tmp" \
    && tar -xzf "$tarball" -C "$tmp" "merlin-models-$VERSION/tests" "merlin-models-$VERSION/pytest.ini" \
    && rm -rf "$TESTS" && mv "$tmp/merlin-models-$VERSION" "$TESTS" && rm -rf "$tmp" \
    || { echo "[peer] extracting $tarball failed"; rm -rf "$tmp"; return 1; }
}

ids() { sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$1"; }
# the selection of this tier, whole lines (counts.py reads their "# no block" marks)
tier() { if [[ "$FULL" == 1 ]]; then cat "$1"; else grep -v "# full:" "$1"; fi; }

# After a run timed out: the test each process was in (the plugin keeps it in <tag>*.current).
report_stuck() {
  local f
  for f in "$OUT/$1"*.current; do
    [[ -s "$f" ]] && echo "[peer] $(basename "$f" .current): stuck in $(cat "$f")"
  done
}

finish() {  # finish NAME TAG SELECTION RC SECONDS
  local name="$1" tag="$2" sel="$3" rc="$4" took="$5"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "[peer] $name: TIMED OUT after ${took}s"; report_stuck "$tag"
  fi
  python "$PEER/counts.py" "$OUT" "$tag" "$sel" || rc=1
  echo "[peer] $name finished with exit code $rc in ${took}s"
  [[ $rc -eq 0 ]] || STATUS=1
}

STATUS=0
fetch_tests || exit 1
python "$PEER/counts.py" --check-lists "$PEER/xfail.txt" "$PEER/selection.txt" "$PEER/selection_hvd.txt" \
  || exit 1
rm -rf "$OUT" && mkdir -p "$OUT"
tier "$PEER/selection.txt" > "$OUT/selection.one.txt"
tier "$PEER/selection_hvd.txt" > "$OUT/selection.np2.txt"
cd "$TESTS"
PYTEST=(python -m pytest -p mmde_swap -p no:cacheprovider -q --tb=short)

mapfile -t SEL1 < <(ids "$OUT/selection.one.txt")
start=$SECONDS
# two pytest workers (pytest-xdist), a test at a time each: the tests are independent
MMDE_TAG=one timeout --kill-after=30 "$T1" "${PYTEST[@]}" -n 2 --dist load "${SEL1[@]}"
finish "peer, one process (${#SEL1[@]} tests)" one "$OUT/selection.one.txt" $? $((SECONDS - start))

mapfile -t SEL2 < <(ids "$OUT/selection.np2.txt")
start=$SECONDS
MMDE_TAG=np2 OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 \
  timeout --kill-after=30 "$T2" horovodrun --gloo -np 2 -H localhost:2 --network-interface lo \
  "${PYTEST[@]}" "${SEL2[@]}"
finish "peer, horovodrun -np 2 (${#SEL2[@]} tests)" np2 "$OUT/selection.np2.txt" $? $((SECONDS - start))

[[ $STATUS -eq 0 ]] && echo "[peer] PASSED" || echo "[peer] FAILED"
exit $STATUS
