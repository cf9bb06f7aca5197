"""Shared fixtures: small hand-built Merlin schemas and Merlin's synthetic schemas."""
import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")


@pytest.fixture(scope="session")
def synthetic_schema():
    from merlin_models_de.schemas import synthetic_schema as load

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load(name)
        return cache[name]

    return get


_TIMES = os.environ.get("MMDE_TEST_TIMES")


def pytest_runtest_logreport(report):
    """``MMDE_TEST_TIMES=path``: appends each test phase's seconds as it ends (with the rank
    under horovodrun), so a run cut short by its timeout still shows where the time went."""
    if _TIMES:
        with open(_TIMES, "a", encoding="utf-8") as out:
            out.write(f"{report.duration:8.2f} r{os.environ.get('HOROVOD_RANK', '-')} "
                      f"{report.when} {report.nodeid}\n")
