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
