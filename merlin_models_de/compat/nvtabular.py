"""What the serving ensemble relies on in NVTabular beyond its documented API, behind a
version check.

- :func:`with_class`: a fitted operator's state moved to an instance of a subclass (the
  ensemble serves each ``Categorify`` as ``ValueCategorify``; the state, vocabulary paths
  included, lives in the operator's ``__dict__`` in 23.08);
- :func:`vocabulary_path`: where ``Categorify`` wrote a column's fitted vocabulary
  (``Categorify.categories``);
- the layout of ``Categorify``'s ids the value-only hashing keeps (0 padding, 1 null,
  ``[2, 2 + num_buckets)`` out of vocabulary) and its failure on a batch null in every row
  are 23.08's.
"""

from __future__ import annotations

import os

from merlin_models_de.compat.versions import SKIP_ENV, UnsupportedVersionError, _version_of

SUPPORTED_NVTABULAR = ("23.8",)


def check_nvtabular(found: str | None = None) -> None:
    """Raises :class:`UnsupportedVersionError` unless NVTabular ``found`` (the installed one
    by default) is a supported release; ``MERLIN_MODELS_DE_SKIP_VERSION_CHECK=1`` skips it."""
    if os.environ.get(SKIP_ENV) == "1":
        return
    found = _version_of(("nvtabular",)) if found is None else found
    if found is None or not any(
        found == p or found.startswith(p + ".") for p in SUPPORTED_NVTABULAR
    ):
        raise UnsupportedVersionError(
            f"merlin_models_de's serving does not support nvtabular {found or 'not installed'} "
            f"(supported: {', '.join(p + '.*' for p in SUPPORTED_NVTABULAR)}): it relies on "
            f"its Categorify's ids and state. Install the supported version, or set "
            f"{SKIP_ENV}=1 to skip this check at your own risk."
        )


def with_class(op, cls):
    """A ``cls`` (a subclass of ``type(op)``) holding ``op``'s fitted state."""
    check_nvtabular()
    if not isinstance(op, cls.__mro__[1]):
        raise TypeError(f"{cls.__name__} does not extend {type(op).__name__}")
    served = cls.__new__(cls)
    served.__dict__.update(op.__dict__)
    return served


def vocabulary_path(op, column: str):
    """The parquet file of the vocabulary ``Categorify`` ``op`` fitted for ``column``, or
    None."""
    check_nvtabular()
    return getattr(op, "categories", {}).get(column)
