"""The supported versions (compat/versions.py): an unsupported or missing dependency is named
with its version and the supported ones; a missing Horovod is fine in one process."""

import pytest

from merlin_models_de.compat.versions import (
    SUPPORTED,
    UnsupportedVersionError,
    check_versions,
    installed_versions,
)

GOOD = {"tensorflow": "2.12.1", "merlin-models": "23.8.0", "horovod": "0.28.1"}


def test_the_installed_stack_is_supported():
    check_versions(installed_versions())
    assert set(installed_versions()) == set(SUPPORTED)


def test_supported_versions_pass_and_horovod_may_be_missing():
    check_versions(GOOD)
    check_versions(dict(GOOD, horovod=None))


@pytest.mark.parametrize(
    "name, version, shown",
    [
        ("tensorflow", "2.13.0", "tensorflow 2.13.0 (supported: 2.12.*)"),
        ("tensorflow", "2.120", "tensorflow 2.120 (supported: 2.12.*)"),  # not a 2.12 release
        ("merlin-models", None, "merlin-models not installed (supported: 23.8.*)"),
        ("horovod", "0.27.0", "horovod 0.27.0 (supported: 0.28.*)"),
    ],
)
def test_an_unsupported_version_is_named(name, version, shown):
    with pytest.raises(
        UnsupportedVersionError, match=shown.replace("(", r"\(").replace(")", r"\)")
    ):
        check_versions(dict(GOOD, **{name: version}))
