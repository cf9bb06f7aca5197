"""The two test tiers, for every suite under tests/ (unit, ranks, multi-host), and the fixtures
the suites share.

CI (`bash ci/test.sh`) runs the CI tier; `bash ci/test.sh --full` (MMDE_FULL=1) runs every test.
A test marked ``full`` repeats, on another parametrization or a bigger setup, what a CI-tier
test of the same behaviour already checks; each parameter value a test takes is still run by
the CI tier at least once. The tier exists because CI has one budget (60 minutes on 2 cores)
and the whole suite takes longer; the deselected count is printed so nothing leaves silently.
"""

import os
import warnings

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")

FULL = os.environ.get("MMDE_FULL", "") == "1"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full: runs only in the full tier (MMDE_FULL=1, `bash ci/test.sh --full`)"
    )


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    left_out = [item for item in items if item.get_closest_marker("full")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("full")]


_TIMES = os.environ.get("MMDE_TEST_TIMES")


def pytest_runtest_logreport(report):
    """``MMDE_TEST_TIMES=path``: appends each test phase's seconds as it ends, with the rank
    under horovodrun, the pytest-xdist worker, the clock and the outcome, so a run cut short by
    its timeout still shows where the time went. Written by the process that ran the test only (xdist's controller
    receives every report again)."""
    if not _TIMES or hasattr(report, "node"):
        return
    import time

    who = f"r{os.environ.get('HOROVOD_RANK', '-')}/{os.environ.get('PYTEST_XDIST_WORKER', '-')}"
    with open(_TIMES, "a", encoding="utf-8") as out:
        out.write(
            f"{report.duration:8.2f} {who} {report.when} {report.nodeid} "
            f"{time.strftime('%H:%M:%S')} {report.outcome}\n"
        )


@pytest.fixture(scope="session")
def synthetic_schema():
    """Merlin's synthetic schema by name, loaded once per session."""
    from merlin_models_de.apps.common.schemas import synthetic_schema as load

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load(name)
        return cache[name]

    return get
