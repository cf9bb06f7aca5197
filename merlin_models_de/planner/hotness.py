"""Mean ids per sample of a feature: the one reader of ``hotness`` for the planner's
estimates (``work``: ``work_balanced``'s placement and the per-rank step; ``cost``: a step's
collectives and bytes). Pure Python.

``hotness`` is one number for every multi-hot feature, a dict by feature name, or None. A
one-hot feature reads 1 id a sample whatever is given. A multi-hot feature without a value
(None, or missing from the dict) reads what its schema declares (``FeatureSpec.hotness``,
the ``value_count`` that ``tables_from_schema`` read), else :data:`DEFAULT_MULTI_HOT`, in
every estimate: the block places ``work_balanced`` from its tables alone, and the plan
command, given the same schema and no ``--hotness``, places the same. The commands say which
values they assumed (``apps/common/hotness.py``).

Example:
    >>> from merlin_models_de.tables import FeatureSpec
    >>> m = FeatureSpec("m", "m", multi_hot=True, combiner="sum")
    >>> ids_per_sample(m, {"m": 2.5}), ids_per_sample(m, None), ids_per_sample(m, {})
    (2.5, 4.0, 4.0)
    >>> ids_per_sample(FeatureSpec("m", "m", True, "sum", hotness=3.0), None)
    3.0
    >>> ids_per_sample(FeatureSpec("a", "a"), 7)
    1.0
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from merlin_models_de.tables import FeatureSpec

# Mean ids per sample of a multi-hot feature whose hotness neither the caller nor its schema
# gives.
DEFAULT_MULTI_HOT = 4.0


def check_hotness(hotness, features: Sequence[FeatureSpec] | None = None) -> None:
    """Raises ValueError naming ``hotness`` unless it is None, a finite number >= 0 or a dict
    of them by feature name (the feature named where its value is wrong); with ``features``
    (the tables' features), also where the dict names a feature that is not one of them (a
    misspelt name would otherwise fall back to the default without a word)."""
    if isinstance(hotness, Mapping):
        for name, value in hotness.items():
            if value is not None and not _is_count(value):
                raise ValueError(
                    f"hotness of feature '{name}' must be a number >= 0. "
                    f"Received: hotness={dict(hotness)!r}"
                )
        known = {f.name for f in features or ()}
        unknown = sorted(str(name) for name in hotness if name not in known)
        if features is not None and unknown:
            multi = [f.name for f in features if f.multi_hot]
            raise ValueError(
                f"hotness names features that the tables do not have: {unknown} (multi-hot "
                f"features: {multi}). Received: hotness={dict(hotness)!r}"
            )
    elif hotness is not None and not _is_count(hotness):
        raise ValueError(
            f"hotness must be a number >= 0 or a dict of them by feature. "
            f"Received: hotness={hotness!r}"
        )


def ids_per_sample(feature: FeatureSpec, hotness=None) -> float:
    """1 for a one-hot feature; for a multi-hot one its value in ``hotness`` (one number or
    a dict by feature name), else the one its schema declares, else
    :data:`DEFAULT_MULTI_HOT`."""
    if not feature.multi_hot:
        return 1.0
    given = hotness.get(feature.name) if isinstance(hotness, Mapping) else hotness
    if given is None:
        given = feature.hotness
    return DEFAULT_MULTI_HOT if given is None else float(given)


def _is_count(value) -> bool:
    # inf passes ">= 0" but no step reads infinitely many ids (int(inf) raises OverflowError)
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    return number and math.isfinite(value) and value >= 0
