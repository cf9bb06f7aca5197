"""Which releases of TensorFlow, Merlin Models and Horovod this package supports, checked at
first use: outside them it stops with one message naming what it found."""

from __future__ import annotations

import importlib.metadata
import os

# distribution -> supported release prefixes (major.minor)
SUPPORTED = {"tensorflow": ("2.12",), "merlin-models": ("23.8",), "horovod": ("0.28",)}
SKIP_ENV = "MERLIN_MODELS_DE_SKIP_VERSION_CHECK"
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")
_MARK = "_mmde_hooks"
_state = {"checked": False}


class UnsupportedVersionError(RuntimeError):
    """An installed dependency is outside the versions this package was built against."""


def _version_of(distributions) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict:
    """``{name: version or None}`` for the dependencies in :data:`SUPPORTED`."""
    return {
        "tensorflow": _version_of(_TF_DISTRIBUTIONS),
        "merlin-models": _version_of(("merlin-models",)),
        "horovod": _version_of(("horovod",)),
    }


def check_versions(installed: dict | None = None) -> None:
    """Raises :class:`UnsupportedVersionError` when an installed version is unsupported.

    Args:
        installed: ``{name: version}``; the installed versions by default. A missing
            Horovod (None) is fine: one process needs none.
    """
    installed = installed_versions() if installed is None else installed
    bad = []
    for name, prefixes in SUPPORTED.items():
        found = installed.get(name)
        if found is None and name == "horovod":
            continue
        if found is None or not any(found == p or found.startswith(p + ".") for p in prefixes):
            bad.append(
                f"{name} {found or 'not installed'} (supported: "
                f"{', '.join(p + '.*' for p in prefixes)})"
            )
    if bad:
        raise UnsupportedVersionError(
            "merlin_models_de does not support the installed "
            + "; ".join(bad)
            + f". Install the supported versions (ci/requirements.txt), or set {SKIP_ENV}=1 to "
            "skip this check at your own risk."
        )


def ensure_supported() -> None:
    """:func:`check_versions` once per process (unless turned off by the environment)."""
    if _state["checked"] or os.environ.get(SKIP_ENV) == "1":
        return
    check_versions()
    _state["checked"] = True
