"""A Merlin Systems ensemble: raw rows -> the NVTabular workflow -> the exported model.

The model is the single-process SavedModel that ``model.save(path)`` writes (under
horovodrun, from rank 0, with the full tables). Between the workflow and the model,
:class:`~.model_inputs.ModelInputs` casts the workflow's output to the model's signature;
before the graph, every request is checked against the workflow's input schema
(:mod:`.request`). ``Ensemble.transform(df)`` runs the graph in this process;
``Ensemble.export(path)`` writes a Triton model repository.

Example:
    >>> ensemble = ranking_ensemble("out/workflow", "out/model", label_columns=["click"])  # doctest: +SKIP
    >>> scores = ensemble.transform(raw_rows)  # doctest: +SKIP
"""

from __future__ import annotations

from merlin_models_de.serving.loading import load_model


def load_workflow(workflow):
    """A fitted NVTabular workflow, or the directory ``workflow.save`` wrote."""
    import nvtabular as nvt

    return workflow if isinstance(workflow, nvt.Workflow) else nvt.Workflow.load(str(workflow))


def serving_workflow(workflow, label_columns=()):
    """``workflow`` without the columns only training has (labels): the ensemble's input
    is what a request carries. Refused when it hashes with NVTabular's row-dependent hash
    (:func:`~.served_workflow.refuse_row_hashing`); served with ``Categorify`` encoding
    a batch whose column is null in every row, and with the list columns' input dtypes the
    fit could not tell (:mod:`.served_workflow`). A workflow object is copied first."""
    from merlin_models_de.serving.served_workflow import prepared

    workflow = load_workflow(workflow)
    present = [c for c in label_columns if c in workflow.input_schema.column_names]
    return prepared(workflow, present)


def workflow_and_model(workflow, model_path: str, label_columns=()):
    """``(node, workflow)``: the raw columns the workflow reads (labels removed)
    ``>> TransformWorkflow(workflow) >> ModelInputs >> PredictTensorflow(model_path)``,
    and that workflow. ``ModelInputs`` hands the model its signature's columns in its
    dtypes, so the workflow is served as it was fitted (float64 continuous columns, lists
    empty in every row, columns the model does not take)."""
    from merlin.systems.dag.ops.tensorflow import PredictTensorflow
    from merlin.systems.dag.ops.workflow import TransformWorkflow

    from merlin_models_de.serving.model_inputs import ModelInputs

    workflow = serving_workflow(workflow, label_columns)
    predict = PredictTensorflow(str(model_path))
    node = (
        workflow.input_schema.column_names
        >> TransformWorkflow(workflow)
        >> ModelInputs.of(predict)
        >> predict
    )
    return node, workflow


def checked_ensemble(node, workflow):
    """The ``Ensemble`` of ``node`` whose input is ``workflow``'s, checking every request
    against the workflow's input schema first (:mod:`.request`)."""
    from merlin_models_de.serving.request import CheckedEnsemble

    return CheckedEnsemble(node, workflow.input_schema)


def ranking_ensemble(workflow, model_path: str, label_columns=()):
    """An ``Ensemble`` from raw rows to the model's predictions (:func:`workflow_and_model`)
    that checks every request against the workflow's input schema first."""
    return checked_ensemble(*workflow_and_model(workflow, model_path, label_columns))


def column_array(output, name: str):
    """Column ``name`` of an ensemble's output (a DataFrame holds one array per row, a
    TensorTable one tensor) as one numeric array, a row per request row."""
    import numpy as np

    column = output[name]
    values = getattr(column, "values", column)
    values = values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)
    if values.dtype == object:
        values = np.stack([np.asarray(v) for v in values])
    return values


__all__ = [
    "checked_ensemble",
    "column_array",
    "load_model",
    "load_workflow",
    "ranking_ensemble",
    "serving_workflow",
    "workflow_and_model",
]
