"""The fitted NVTabular workflow as the ensemble serves it.

Three things NVTabular 23.08 gets wrong for serving, each handled here before the ensemble
is built:

- it hashes on CPU with the row's index (``HashBucket``, ``Categorify(num_buckets=k)``'s
  out-of-vocabulary buckets): a value gets a different id in every row, so the model was
  trained on noise and a row scores differently alone than in a batch. Such a workflow is
  refused (:func:`refuse_row_hashing`), naming the column and the operator of
  :mod:`.hashing` to fit with instead;
- its ``Categorify`` fails on a batch whose column is null in every row (a one-row request
  with a null; a ``JoinExternal`` row whose key the side table lacks). Served, each
  ``Categorify`` is a :class:`~.hashing.ValueCategorify` with the same fitted state, which
  encodes such a batch as the null id, as ``Categorify`` encodes those rows in a batch with
  others;
- a list column whose first row was empty at fit time has the input dtype ``unknown``,
  which Triton's configuration cannot hold: its dtype is read from the column's fitted
  vocabulary (:func:`typed_inputs`).
"""

from __future__ import annotations

import copy


class RowHashingError(ValueError):
    """A workflow hashes with NVTabular's row-dependent hash; the message names the column."""


def row_hashing(workflow) -> list:
    """``[(column, what hashes it)]``: the workflow's columns NVTabular 23.08 hashes with the
    row's index (``HashBucket``; ``Categorify`` with ``num_buckets``)."""
    from merlin.dag.node import iter_nodes
    from nvtabular.ops import Categorify, HashBucket

    found = []
    for node in iter_nodes([workflow.output_node]):
        op = node.op
        if getattr(op, "hashes_value_only", False):  # ours, also as a loaded workflow has it
            continue
        if isinstance(op, HashBucket):
            found += [(name, f"HashBucket({op.num_buckets})") for name in _written(node)]
        elif isinstance(op, Categorify):
            for name in _written(node):
                buckets = op.num_buckets
                if isinstance(buckets, dict):
                    buckets = buckets.get(name)
                if buckets:
                    found.append((name, f"Categorify(num_buckets={buckets})"))
    return sorted(found)


def _written(node) -> list:
    return list(node.output_schema.column_names) if node.output_schema else []


def refuse_row_hashing(workflow) -> None:
    """Raises :class:`RowHashingError` naming every column :func:`row_hashing` finds."""
    found = row_hashing(workflow)
    if found:
        named = ", ".join(f"{name!r} ({what})" for name, what in found)
        raise RowHashingError(
            f"The workflow hashes columns {named} with NVTabular's hash, which on CPU "
            "includes the row's index: the same value gets a different id in every row "
            "(training saw noise, a row scores differently alone than in a batch). Fit the "
            "workflow with merlin_models_de.serving.hashing's ValueHashBucket instead of "
            "HashBucket and ValueCategorify instead of Categorify(num_buckets=...), which "
            "hash the value only, and train the model again."
        )


def served_categorify(workflow) -> None:
    """Turns each ``Categorify`` of ``workflow`` into a :class:`~.hashing.ValueCategorify`
    with the same fitted state (only batches null in every row encode differently: as the
    null id instead of failing). Call on a copy: it changes the workflow's operators."""
    from merlin.dag.node import iter_nodes
    from nvtabular.ops import Categorify

    from merlin_models_de.compat.nvtabular import with_class
    from merlin_models_de.serving.hashing import ValueCategorify

    for node in iter_nodes([workflow.output_node]):
        if type(node.op) is Categorify:
            node.op = with_class(node.op, ValueCategorify)


def typed_inputs(workflow) -> None:
    """Gives each input list column whose fitted dtype is ``unknown`` (its first row was
    empty when the workflow was fitted) the dtype of its ``Categorify`` vocabulary, and
    recomputes the workflow's schemas. Raises ``ValueError`` naming a column whose dtype
    nothing tells."""
    from merlin.schema import Schema

    schema = workflow.input_schema
    unknown = [c.name for c in schema if c.dtype.element_type.value == "unknown"]
    if not unknown:
        return
    vocabularies = _vocabulary_dtypes(workflow)
    columns = []
    for col in schema:
        if col.name in unknown:
            if col.name not in vocabularies:
                raise ValueError(
                    f"The workflow's input column {col.name!r} has dtype unknown (its first "
                    "row was empty or null when the workflow was fitted) and no Categorify "
                    "vocabulary tells it: fit the workflow on rows whose first value of "
                    f"{col.name!r} is not empty"
                )
            col = col.with_dtype(vocabularies[col.name])
        columns.append(col)
    workflow.fit_schema(Schema(columns))


def _vocabulary_dtypes(workflow) -> dict:
    """``{input column: numpy dtype}`` of the vocabularies ``Categorify`` fitted for the
    columns it reads as the workflow reads them."""
    import pandas as pd
    from merlin.dag.node import iter_nodes
    from nvtabular.ops import Categorify

    from merlin_models_de.compat.nvtabular import vocabulary_path

    read = set(workflow.input_schema.column_names)
    out = {}
    for node in iter_nodes([workflow.output_node]):
        if not isinstance(node.op, Categorify):
            continue
        for name in node.input_schema.column_names:
            path = vocabulary_path(node.op, name) if name in read else None
            if path:
                out[name] = pd.read_parquet(path, columns=[name])[name].dtype
    return out


def prepared(workflow, label_columns=()):
    """A copy of the fitted ``workflow`` as the ensemble serves it: ``label_columns``
    removed, row hashing refused, ``Categorify`` null-safe, list input dtypes known."""
    workflow = copy.deepcopy(workflow)
    if label_columns:
        workflow.remove_inputs(list(label_columns))
    refuse_row_hashing(workflow)
    served_categorify(workflow)
    typed_inputs(workflow)
    return workflow


__all__ = [
    "RowHashingError",
    "prepared",
    "refuse_row_hashing",
    "row_hashing",
    "served_categorify",
    "typed_inputs",
]
