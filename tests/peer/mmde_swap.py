"""pytest plugin: Merlin Models 23.8's own tests with ``mm.Embeddings`` swapped for
``mm.DistributedEmbeddings`` (load with ``-p mmde_swap``; ci/peer.sh puts tests/peer and
tests/peer/stubs on PYTHONPATH).

Settings (environment):
  MMDE_SWAP=on|off      on (default): every ``Embeddings(...)`` a test or Merlin makes becomes
                        ``mm.DistributedEmbeddings(...)`` with the same arguments; off: Merlin's
                        own block (a baseline run of the same selection).
  MMDE_OUT=DIR          per-process records (required): <tag>[.rankR][.gwK].results.jsonl, one
                        line per test (outcome, duration, blocks built, first line of the error),
                        and <tag>[.rankR][.gwK].current, the test running now (read when a run
                        times out); gwK: pytest-xdist's worker K (counts.py merges workers).
  MMDE_TAG=NAME         file name stem of the records (default "peer").
  MMDE_XFAIL=FILE       expected failures, ``node id | strict|nonstrict | reason`` a line.
  MMDE_TEST_TIMEOUT=S   a test running longer than S seconds (default 300) prints "rank R stuck
                        for S s in TEST" with every thread's stack and exits the process with
                        code 3 (horovodrun then stops the other ranks): a hang fails, never stalls.

The patch is applied when pytest loads the plugin, before Merlin's conftest and test modules
are imported, so ``mm.Embeddings`` and every ``from ... import Embeddings`` see the swap.
Under horovodrun with more than one rank, Merlin's ``Loader`` gets the README's data rules:
a dataset with fewer partitions than ranks is repartitioned to one per rank, and
``drop_last=True`` (Merlin's test datasets are one partition of 100 rows).
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import sys
import threading

import pytest

MODE = os.environ.get("MMDE_SWAP", "on").lower()
if MODE not in ("on", "off"):
    raise SystemExit(f"mmde_swap: MMDE_SWAP must be 'on' or 'off', got {MODE!r}")
RANK = os.environ.get("HOROVOD_RANK", "")
OUT = os.environ.get("MMDE_OUT")
if not OUT:
    raise SystemExit("mmde_swap: set MMDE_OUT to the directory for the per-test records")
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # pytest -n N: records per worker (gwK)
STEM = os.path.join(
    OUT,
    os.environ.get("MMDE_TAG", "peer")
    + (f".rank{RANK}" if RANK else "")
    + (f".{WORKER}" if WORKER else ""),
)
RESULTS, CURRENT = STEM + ".results.jsonl", STEM + ".current"
TEST_TIMEOUT = float(os.environ.get("MMDE_TEST_TIMEOUT", "300"))
os.makedirs(OUT, exist_ok=True)
open(RESULTS, "w").close()

import merlin.models.tf as mm  # noqa: E402
import merlin.models.tf.blocks.dlrm  # noqa: E402  (modules that import the name
import merlin.models.tf.blocks.interaction  # noqa: E402  must be loaded before the patch)
import merlin.models.tf.models.ranking  # noqa: E402,F401
from merlin.models.tf.inputs import base as _inputs_base  # noqa: E402
from merlin.models.tf.inputs import embedding as _embedding  # noqa: E402
from merlin.schema import Tags  # noqa: E402

import merlin_models_de  # noqa: E402,F401  registers mm.DistributedEmbeddings

ORIGINAL = _embedding.Embeddings
_built = {"n": 0}  # blocks built by the running test: a selected test must build one


@functools.wraps(ORIGINAL)
def Embeddings(schema, *args, **kwargs):  # noqa: N802  (Merlin's name)
    """Merlin's ``Embeddings`` factory, answered by DistributedEmbeddings when the swap is on."""
    _built["n"] += 1
    if MODE == "on":
        return mm.DistributedEmbeddings(schema, *args, **kwargs)
    return ORIGINAL(schema, *args, **kwargs)


PATCHED = []
for _name, _mod in sorted(sys.modules.items()):
    if _name.startswith("merlin.models.tf") and getattr(_mod, "Embeddings", None) is ORIGINAL:
        _mod.Embeddings = Embeddings
        PATCHED.append(_name)
# InputBlockV2's default categorical branch: its default argument is this same dict
if _inputs_base.INPUT_TAG_TO_BLOCK.get(Tags.CATEGORICAL) is ORIGINAL:
    _inputs_base.INPUT_TAG_TO_BLOCK[Tags.CATEGORICAL] = Embeddings
    PATCHED.append("inputs.base.INPUT_TAG_TO_BLOCK[CATEGORICAL]")
assert mm.Embeddings is Embeddings, "mmde_swap: mm.Embeddings was not patched"


def _world_size():
    if not RANK:
        return 1
    from merlin.models.tf.distributed.backend import hvd, hvd_installed

    return hvd.size() if hvd_installed else 1


from merlin.models.tf import loader as _loader_mod  # noqa: E402

_orig_loader_init = _loader_mod.Loader.__init__


@functools.wraps(_orig_loader_init)
def _loader_init(self, paths_or_dataset, batch_size, *args, **kwargs):
    # README: every rank needs a partition and the same number of equal batches
    n = _world_size()
    if n > 1:
        if getattr(paths_or_dataset, "npartitions", n) < n:
            paths_or_dataset = paths_or_dataset.repartition(npartitions=n)
        kwargs["drop_last"] = True
    return _orig_loader_init(self, paths_or_dataset, batch_size, *args, **kwargs)


_loader_mod.Loader.__init__ = _loader_init


def read_xfail(path):
    """``{node id: (strict, reason)}`` from the expected-failure file; a line without a reason
    or with a mode other than strict / nonstrict is refused, naming the line."""
    known = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != 3 or parts[1] not in ("strict", "nonstrict") or not parts[2]:
                raise pytest.UsageError(
                    f"{path}:{lineno}: expected 'node id | strict|nonstrict "
                    f"| reason', got {line!r}"
                )
            known[parts[0]] = (parts[1] == "strict", parts[2])
    return known


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("MMDE_XFAIL")
    if not path:
        return
    known = read_xfail(path)
    for item in items:
        if item.nodeid in known:
            strict, reason = known[item.nodeid]
            item.add_marker(pytest.mark.xfail(reason=reason, strict=strict))


def pytest_report_header(config):
    return [
        f"mmde_swap: swap={MODE} rank={RANK or '-'} records={STEM}.*",
        "mmde_swap patched Embeddings in: " + ", ".join(PATCHED),
    ]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Counts the blocks a test builds, records it as running, and guards it with a watchdog."""
    _built["n"] = 0
    with open(CURRENT, "w") as f:
        f.write(item.nodeid)
    done = threading.Event()
    threading.Thread(target=_watchdog, args=(item, done), daemon=True).start()
    yield
    done.set()
    with open(CURRENT, "w"):
        pass


def _watchdog(item, done):
    # pytest-timeout's signal cannot interrupt a rank blocked inside a Horovod collective
    if done.wait(TEST_TIMEOUT):
        return
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # pytest holds fd 2; give it back so the report is seen
        capman.suspend_global_capture(in_=True)
    sys.stderr.write(
        f"\n[peer] rank {RANK or '-'} stuck for {TEST_TIMEOUT:.0f}s in "
        f"{item.nodeid}; its stacks:\n"
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(3)


_controller = {"xdist": False}  # pytest -n N's controller: its workers keep the records


def pytest_configure(config):
    _controller["xdist"] = not WORKER and bool(getattr(config.option, "numprocesses", None))


def pytest_runtest_logreport(report):
    """One record per test: the call's outcome, or a setup/teardown problem."""
    if _controller["xdist"] or (report.when != "call" and report.passed):
        return
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.skipped:
        outcome = "skipped"
    elif report.when != "call":
        outcome = "error"
    else:
        outcome = report.outcome
    rec = {
        "test": report.nodeid,
        "when": report.when,
        "outcome": outcome,
        "duration": round(report.duration, 2),
        "built": _built["n"],
        "rank": RANK,
    }
    if report.failed:
        rec["error"] = (
            report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""
        )
    with open(RESULTS, "a") as f:
        f.write(json.dumps(rec) + "\n")
