"""The link probe's fit (apps/tools/link_probe.py): latency and bandwidth recovered from
timed sizes, and one size alone refused naming what it received."""

import pytest

from merlin_models_de.apps.tools.link_probe import fit


def test_latency_and_bandwidth_of_exact_points():
    # 0.2 ms latency, 2.5 GB/s: ms = 0.2 + bytes / 2.5e6
    points = [(size, 0.2 + size / 2.5e6) for size in (1024, 65536, 4194304)]
    assert fit(points) == (0.2, 2.5)


def test_a_flat_line_is_an_infinite_bandwidth():
    assert fit([(1, 3.0), (2, 3.0)]) == (3.0, float("inf"))


def test_one_size_cannot_be_fit():
    with pytest.raises(ValueError, match=r"Received: \[1024\]"):
        fit([(1024, 1.0), (1024, 1.1)])
