"""Parametrizations split between the CI and the full tier (tests/conftest.py)."""

import pytest


def diagonal(first, second, ids=(str, str)):
    """Every pair of ``first`` x ``second`` as pytest params (``ids``: how each value is
    named). The CI tier runs the pairs whose indices agree modulo the shorter list's length,
    so each value of both lists runs at least once; the full tier runs them all
    (tests/conftest.py)."""
    n = min(len(first), len(second))
    return [
        pytest.param(
            a, b, id=f"{ids[0](a)}-{ids[1](b)}", marks=() if i % n == j % n else pytest.mark.full
        )
        for i, a in enumerate(first)
        for j, b in enumerate(second)
    ]
