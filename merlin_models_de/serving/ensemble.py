"""A Merlin Systems ensemble: raw rows -> the NVTabular workflow -> the exported model.

The model is the single-process SavedModel that ``model.save(path)`` writes (under
horovodrun, from rank 0, with the full tables). ``Ensemble.transform(df)`` runs the graph in
this process; ``Ensemble.export(path)`` writes a Triton model repository.

Example:
    >>> ensemble = ranking_ensemble("out/workflow", "out/model", label_columns=["click"])  # doctest: +SKIP
    >>> scores = ensemble.transform(raw_rows)  # doctest: +SKIP
"""
from __future__ import annotations


def load_model(path: str):
    """The model ``model.save(path)`` wrote, in this process. The package's layers register
    with Keras when their modules load, which is lazy: without them Keras cannot rebuild
    the model from its config and revives a bare copy without Merlin's methods (no
    ``schema``, no ``blocks``)."""
    import merlin.models.tf  # noqa: F401  (attaches mm.DistributedEmbeddings)
    import tensorflow as tf

    import merlin_models_de.block.layer  # noqa: F401
    import merlin_models_de.outputs.tied  # noqa: F401
    import merlin_models_de.outputs.topk  # noqa: F401

    return tf.keras.models.load_model(str(path))


def load_workflow(workflow):
    """A fitted NVTabular workflow, or the directory ``workflow.save`` wrote."""
    import nvtabular as nvt

    return workflow if isinstance(workflow, nvt.Workflow) else nvt.Workflow.load(str(workflow))


def serving_workflow(workflow, label_columns=()):
    """``workflow`` without the columns only training has (labels): the ensemble's input
    is what a request carries."""
    workflow = load_workflow(workflow)
    present = [c for c in label_columns if c in workflow.input_schema.column_names]
    return workflow.remove_inputs(present) if present else workflow


def ranking_ensemble(workflow, model_path: str, label_columns=()):
    """``TransformWorkflow(workflow) >> PredictTensorflow(model_path)`` as an ``Ensemble``
    whose input is the raw columns the workflow reads (labels removed)."""
    from merlin.systems.dag import Ensemble
    from merlin.systems.dag.ops.tensorflow import PredictTensorflow
    from merlin.systems.dag.ops.workflow import TransformWorkflow

    workflow = serving_workflow(workflow, label_columns)
    ops = (workflow.input_schema.column_names >> TransformWorkflow(workflow)
           >> PredictTensorflow(str(model_path)))
    return Ensemble(ops, workflow.input_schema)


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


__all__ = ["column_array", "load_model", "load_workflow", "serving_workflow", "ranking_ensemble"]
