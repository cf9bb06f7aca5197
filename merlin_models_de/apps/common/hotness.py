"""Mean ids per sample of multi-hot features, for the commands that predict a step (the bench's
cost model, the plan command): from ``--hotness``, else the schema's ``value_count``."""

from __future__ import annotations

import math

from merlin_models_de.tables import declared_hotness


def parse_hotness(text):
    """``'3'`` -> 3.0; ``'a=2,b=5.5'`` -> ``{'a': 2.0, 'b': 5.5}``; None -> None. Every value
    is a finite number >= 0 (``inf``, ``nan`` and negatives raise ValueError naming it)."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return _ids(text)
        pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
        return {_name(name): _ids(value) for name, value in pairs}
    except ValueError as err:
        raise ValueError(
            f"--hotness must be a number >= 0 or feature=number,... ({err}). "
            f"Received: --hotness={text!r}"
        ) from None


def _ids(value: str) -> float:
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{value.strip()!r} is not a finite number >= 0")
    return number


def _name(name: str) -> str:
    if not name.strip():
        raise ValueError("a value without a feature name")
    return name.strip()


def schema_hotness(schema, features) -> dict:
    """``{feature: (ids per sample, where from)}`` for the multi-hot features whose schema
    declares a ``value_count``: its max, else its min (a lower bound: say so)."""
    out = {}
    for f in features:
        if f.multi_hot:
            value, end = declared_hotness(schema[f.name])
            if value is not None:
                out[f.name] = (value, f"schema value_count.{end}")
    return out


def resolve_hotness(text, schema, features, default: float | None = None):
    """The hotness to model and one line saying where each multi-hot feature's came from
    (None when there is none): ``--hotness`` (``text``), else the schema's, else ``default``;
    without a default a feature with neither raises ValueError naming it."""
    given = parse_hotness(text)
    multi = [f.name for f in features if f.multi_hot]
    unknown = sorted(set(given) - set(multi)) if isinstance(given, dict) else []
    if unknown:
        raise ValueError(
            f"--hotness names features that are not multi-hot features of the "
            f"schema ({multi}). Received: {unknown}"
        )
    if not multi:
        return given, None
    found = schema_hotness(schema, features)
    used = {}
    for name in multi:
        if isinstance(given, dict) and name in given:
            used[name] = (given[name], "--hotness")
        elif isinstance(given, float):
            used[name] = (given, "--hotness")
        elif name in found:
            used[name] = found[name]
        elif default is not None:
            used[name] = (default, "assumed")
        else:
            raise ValueError(
                f"Multi-hot feature '{name}' has no value_count in the schema; "
                f"give its mean ids per sample: --hotness {name}=H. "
                f"Received: --hotness={text!r}"
            )
    line = "hotness: " + ", ".join(f"{name}={h:g} ({src})" for name, (h, src) in used.items())
    return {name: h for name, (h, _) in used.items()}, line
