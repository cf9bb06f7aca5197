"""The blocks' features in ``fit`` / ``evaluate`` / ``predict``'s input, checked before Keras
traces a step.

Inside the traced step a bad feature surfaces as a ValueError at the end of a long graph
trace, after Keras' data adapter has cast float64 arrays to float32 (so the dtype it names
is not the one given). Read from the input itself (arrays and tensors, alone or in a dict or
an ``(x, y)`` tuple, or a ``tf.data`` element spec) a float or string id column, a one-hot
feature fed several ids per sample and a feature of the model's input schema missing from
the input are refused in one line naming the feature and what was received. On several
ranks every rank raises together (:mod:`merlin_models_de.runtime.agree`). Inputs whose
values only reading tells (a ``Loader``, a ``Sequence``, a generator) go to the step's own
checks.

Example:
    >>> check_inputs(model, "fit", {"x": {"user": ids.astype("float64")}})  # doctest: +SKIP
    ValueError: fit: x: feature 'user' (block 'embeddings') must hold integer ids. Received: dtype=float64
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.runtime import agree
from merlin_models_de.variables import embedding_blocks


def check_inputs(model, method: str, arguments) -> None:
    """Raises (on every rank together) the first problem :func:`input_problem` finds in the
    call's ``x`` or ``validation_data`` (``arguments``: the call's arguments by name)."""

    def work():
        for argument in ("x", "validation_data"):
            problem = input_problem(model, arguments.get(argument))
            if problem is not None:
                raise ValueError(f"{method}: {argument}: {problem}")

    if comm.size() == 1:
        return work()
    agree.on_every_rank(f"{method}: checking the inputs' features", work, error_type=ValueError)


def input_problem(model, data) -> str | None:
    """What is wrong with ``data``'s features for ``model``'s blocks, or None (also when
    ``data`` is not one the module reads without reading it)."""
    features = _features_of(data)
    blocks = embedding_blocks(model) if features is not None else []
    if not blocks:
        return None
    expected = set(_input_columns(model))
    for block in blocks:
        for feature in block.features:
            name = feature.name
            if name not in features:
                # list columns arrive from Merlin's loader as name__values / name__offsets
                given = name in expected and f"{name}__values" not in features
                if given:
                    return (
                        f"feature '{name}' (block '{block.name}') is missing. "
                        f"Received keys: {sorted(features)}"
                    )
                continue
            problem = _value_problem(features[name], feature.multi_hot)
            if problem is not None:
                return f"feature '{name}' (block '{block.name}') {problem}"
    return None


def _features_of(data):
    """``{name: (dtype, per-sample shape or None)}`` of ``data``'s features, or None."""
    if isinstance(data, tf.data.Dataset):
        data = data.element_spec
    if isinstance(data, tuple) and data:
        data = data[0]
    if not isinstance(data, dict):
        return None
    out = {}
    for name, value in data.items():
        dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
        if dtype is None:
            return None  # not arrays: left to the step's checks
        ragged = isinstance(value, (tf.RaggedTensor, tf.RaggedTensorSpec, tf.SparseTensor))
        out[name] = (dtype, None if ragged or shape is None else tuple(shape)[1:])
    return out


def _value_problem(value, multi_hot: bool) -> str | None:
    dtype, per_sample = value
    if not _is_integer(dtype):
        return f"must hold integer ids. Received: dtype={_dtype_name(dtype)}"
    if multi_hot or per_sample is None:
        return None
    ids = [d for d in per_sample if d != 1]
    if ids and None not in ids:
        return (
            "is one-hot in the schema: one id per sample ([batch] or [batch, 1]). "
            f"Received: shape=(batch, {', '.join(str(d) for d in per_sample)})"
        )
    return None


def _is_integer(dtype) -> bool:
    try:
        return tf.as_dtype(dtype).is_integer
    except TypeError:  # strings, objects, pandas' own dtypes
        return False


def _dtype_name(dtype) -> str:
    return getattr(dtype, "name", None) or str(dtype)


def _input_columns(model) -> list:
    """The column names of a Merlin model's input schema (none for other models)."""
    schema = getattr(model, "schema", None)
    return list(getattr(schema, "column_names", None) or [])


__all__ = ["check_inputs", "input_problem"]
