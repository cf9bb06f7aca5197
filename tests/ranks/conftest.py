"""Multi-process tests run under `horovodrun -np 2 python -m pytest tests/ranks`.

A watchdog guards each test: a rank stuck longer than MMDE_TEST_TIMEOUT seconds (default 300)
prints "rank R stuck for S s in TEST", dumps its Python stacks, and exits with code 3, which
makes horovodrun stop the other ranks and fail; a hang never stalls CI.
"""

import faulthandler
import os
import sys
import threading

import pytest

TIMEOUT = float(os.environ.get("MMDE_TEST_TIMEOUT", "300"))


def pytest_collection_modifyitems(config, items):
    if "HOROVOD_RANK" not in os.environ:
        skip = pytest.mark.skip(
            reason="multi-process test: run under horovodrun -np 2 (ci/test.sh)"
        )
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _watchdog(request):
    rank = os.environ.get("HOROVOD_RANK", "?")
    done = threading.Event()

    def fire():
        if done.wait(TIMEOUT):
            return
        capman = request.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:  # pytest holds fd 2; give it back so the report is seen
            capman.suspend_global_capture(in_=True)
        sys.stderr.write(
            f"\n[merlin-models-de] rank {rank} stuck for {TIMEOUT:.0f}s in "
            f"{request.node.nodeid}; its stacks:\n"
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    threading.Thread(target=fire, daemon=True).start()
    yield
    done.set()


@pytest.fixture(scope="session")
def hvd():
    """horovod.tensorflow, initialized through the package's comm layer."""
    from merlin_models_de import comm

    h = comm.hvd()
    assert h is not None and h.size() >= 2, "run these tests with horovodrun -np 2"
    return h
