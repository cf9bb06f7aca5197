"""Backend names (backends/registry.py): an unknown name is refused naming it, ``auto``
resolves to a backend that can run here, and a named backend's class is the one created."""

import pytest

from merlin_models_de.backends import registry


def test_unknown_backends_are_named_with_the_known_ones():
    for call in (registry.check_name, registry.is_installed, registry.backend_class):
        with pytest.raises(ValueError, match=r"'auto', 'horovod'.*Received: backend='nccl'"):
            call("nccl")
    with pytest.raises(ValueError, match="resolved first"):
        registry.backend_class("auto")


def test_auto_picks_an_importable_backend_and_a_named_one_is_kept():
    picked = registry.resolve("auto")
    assert picked in registry.BACKEND_NAMES[1:] and registry.is_importable(picked)
    expected = (
        "distributed-embeddings" if registry.is_importable("distributed-embeddings") else "horovod"
    )
    assert picked == expected
    # distributed-embeddings places only NVIDIA's strategies: work_balanced stays on horovod
    assert registry.resolve("auto", strategy="work_balanced") == "horovod"
    assert registry.resolve("horovod") == "horovod"


def test_the_horovod_backend_class_is_the_built_in_one():
    assert registry.is_installed("horovod") and registry.is_importable("horovod")
    cls = registry.backend_class("horovod")
    assert cls.__name__ == "HorovodBackend" and cls.__module__.startswith(
        "merlin_models_de.backends"
    )
