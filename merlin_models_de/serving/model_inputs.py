"""The ensemble operator between the NVTabular workflow and the model: the workflow's output
as the model's serving signature takes it.

A workflow writes what its operators produce (``Normalize``: float64; a list column empty
in every row of a batch: float64 values of shape ``(0,)``; Groupby: scalar columns beside
the lists), and a SavedModel's signature takes fixed dtypes and only its own columns.
:class:`ModelInputs` selects the signature's tensors and casts each to the signature's
dtype and rank, so a workflow is served as it was written.

The class needs only Merlin and NumPy: ``Ensemble.export`` pickles it by value (see
:mod:`.request`), and Triton's executor runs it without this package installed.

Example:
    >>> predict = PredictTensorflow(path)  # doctest: +SKIP
    >>> inputs = ModelInputs.of(predict)  # doctest: +SKIP
    >>> node = columns >> TransformWorkflow(workflow) >> inputs >> predict  # doctest: +SKIP
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
from merlin.dag import BaseOperator, ColumnSelector, DataFormats
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_models_de.serving.request import RequestError

# Ensemble.export pickles the graph for Triton's executor: carry this code in the pickle
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ModelInputs(BaseOperator):
    """Selects the tensors a model's serving signature takes and casts each to the
    signature's dtype and rank (``[batch]`` and ``[batch, 1]`` scalars are reshaped into
    each other). ``specs``: ``{tensor name: (numpy dtype name, rank)}``, list columns as
    ``<name>__values`` / ``<name>__offsets``; ``schema``: the model's input schema (what the
    next operator, e.g. ``PredictTensorflow``, declares)."""

    def __init__(self, specs: dict, schema: Schema):
        super().__init__()
        self.specs = {name: (str(dtype), int(rank)) for name, (dtype, rank) in specs.items()}
        self.schema = schema

    @classmethod
    def of(cls, predict) -> "ModelInputs":
        """The inputs of a ``PredictTensorflow`` operator's model (its ``serving_default``
        signature)."""
        signature = predict.model.signatures["serving_default"]
        _, specs = signature.structured_input_signature
        return cls(
            {
                name: (np.dtype(spec.dtype.as_numpy_dtype).name, spec.shape.rank)
                for name, spec in specs.items()
            },
            predict.input_schema,
        )

    def compute_input_schema(self, root_schema, parents_schema, deps_schema, selector):
        written = parents_schema + deps_schema
        missing = [c for c in self.schema.column_names if c not in written.column_names]
        if missing:
            raise ValueError(
                f"The model's serving signature takes columns {missing} that "
                f"the workflow does not write. The workflow writes: "
                f"{written.column_names}"
            )
        return written.select_by_name(self.schema.column_names)

    def compute_selector(
        self, input_schema, selector, parents_selector=None, dependencies_selector=None
    ):
        return ColumnSelector(self.schema.column_names)

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        return self.schema

    @property
    def dynamic_dtypes(self):
        return True  # the casting is this operator's job

    @property
    def supported_formats(self) -> DataFormats:
        return DataFormats.NUMPY_TENSOR_TABLE | DataFormats.CUPY_TENSOR_TABLE

    def transform(self, col_selector, transformable):
        tensors = transformable.to_dict()
        out = {}
        for name, (dtype, rank) in self.specs.items():
            value = tensors[name].astype(dtype, copy=False)
            if value.ndim == rank + 1 and value.shape[-1] == 1:
                value = value.reshape(value.shape[:-1])
            elif value.ndim + 1 == rank:
                value = value.reshape(value.shape + (1,))
            _refuse_non_finite(name, tensors[name], value)
            out[name] = value
        return TensorTable(out)


def _refuse_non_finite(name: str, written, value) -> None:
    """Raises :class:`~.request.RequestError` where a float tensor holds a value that is not
    finite after the cast to the model's dtype (``price=1e38`` overflows float32 once the
    workflow has normalized it): the model would score it silently as inf or NaN."""
    if value.dtype.kind != "f" or np.isfinite(value).all():
        return
    at = np.argwhere(~np.isfinite(value))[0]
    where = f"value {int(at[0])} of" if name.endswith("__values") else f"row {int(at[0])}:"
    raise RequestError(
        f"Request {where} the workflow's output column "
        f"{name.removesuffix('__values')!r} is {np.asarray(written)[tuple(at)]!r} "
        f"({written.dtype}), which is not finite as the model's {value.dtype}: send values "
        "the workflow maps into the model's range"
    )


__all__ = ["ModelInputs"]
