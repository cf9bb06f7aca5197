"""Retrieval serving: the query side of a trained next-item model, a Faiss index of its item
table, and an ensemble from raw session rows to the top-k item ids.

The query side is the trained model without its output (the input block, the encoder, the
MLP): it maps a session to a vector whose inner product with an item's row of the table is
the item's score, exactly the logit the tied output computes (it has no bias by default).
The table itself comes from the parallel table export (:mod:`.faiss_index`), so the index
never needs a training process that holds the whole table.

Example (one process, no Horovod):
    >>> model = load_model("out/model")  # model.save under horovodrun  # doctest: +SKIP
    >>> save_query_model(model, "out/query")  # doctest: +SKIP
    >>> build_faiss_index("out/items", "out/items.faiss")  # doctest: +SKIP
    >>> ensemble = retrieval_ensemble("out/workflow", "out/query", "out/items.faiss", k=10)  # doctest: +SKIP
    >>> ids = ensemble.transform(raw_events)["candidate_ids"]  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de.serving.ensemble import checked_ensemble, load_workflow, workflow_and_model
from merlin_models_de.serving.loading import column_of

QUERY_OUTPUT = "query"


class QueryTower(tf.Module):
    """``{column__values, column__offsets, ...}`` (the loader's / Merlin Systems' form of
    the columns) -> ``{"query": [batch, dim]}``: every block of ``model`` but its last (the
    output), with the trained weights. Columns the model does not take are ignored (a
    workflow may write more than the model reads)."""

    def __init__(self, model):
        from merlin.models.tf.transforms.features import PrepareFeatures

        super().__init__(name="query_tower")
        self.model = model
        self.prepare = PrepareFeatures(model.schema)
        self.body = list(model.blocks[:-1])

    def call(self, inputs):
        from merlin.models.tf.utils.tf_utils import call_layer

        wanted = set(self.model.schema.column_names)
        inputs = {k: v for k, v in inputs.items() if column_of(k) in wanted}
        outputs = self.prepare(inputs)
        for block in self.body:
            outputs = call_layer(block, outputs, features=outputs)
        return {QUERY_OUTPUT: outputs}


def _input_signature(schema, offsets_dtype=tf.int64):
    """TensorSpecs of the schema's input columns as Merlin Systems passes them: list
    columns as ``__values`` / ``__offsets``, scalars as ``[batch]`` (as in the signature
    ``model.save`` writes)."""
    from merlin.schema import Tags

    specs = {}
    for col in schema.excluding_by_tag(Tags.TARGET):
        dtype = tf.as_dtype(col.dtype.to_numpy)
        if col.is_list:
            specs[f"{col.name}__values"] = tf.TensorSpec([None], dtype, f"{col.name}__values")
            specs[f"{col.name}__offsets"] = tf.TensorSpec(
                [None], offsets_dtype, f"{col.name}__offsets"
            )
        else:
            specs[col.name] = tf.TensorSpec([None], dtype, col.name)
    return specs


def check_query_side(model) -> None:
    """Refuses a model whose query side is not every block before an output tied to one of
    the block's tables (the index :func:`.faiss_index.build_faiss_index` makes holds that
    table's rows): a two-tower model scores its candidate tower's outputs instead."""
    from merlin_models_de.block.handles import TableHandle

    output = model.blocks[-1] if getattr(model, "blocks", None) else None
    if isinstance(getattr(getattr(output, "to_call", None), "table", None), TableHandle):
        return
    if getattr(model, "has_candidate_encoder", False):
        raise ValueError(
            "save_query_model serves a model whose output is tied to an item table of "
            "DistributedEmbeddings (query vector times the table's rows), but this model "
            "scores the outputs of its candidate tower. For a two-tower model, save "
            "model.query_encoder (Merlin's Encoder.save) and index "
            "model.candidate_embeddings(items), or use model.to_top_k_encoder(items) in one "
            f"process. Received: {type(model).__name__} with a candidate encoder"
        )
    raise ValueError(
        "save_query_model needs a model whose last block is an output tied to an item table "
        "of DistributedEmbeddings (e.g. mm.CategoricalOutput(to_call=block['item_id'])); "
        "a model loaded with tf.keras.models.load_model instead of "
        "merlin_models_de.load_model has no blocks. Received: "
        f"{type(model).__name__} whose last block is {type(output).__name__}"
    )


def save_query_model(model, path: str, workflow=None) -> str:
    """Saves the query side of ``model`` (one process; a trained model whose last block is
    an output tied to the item table) as a SavedModel with a ``serving_default`` signature
    that Merlin Systems' ``PredictTensorflow`` and Triton's TensorFlow backend read. Its
    inputs: the columns ``workflow`` writes (the tower ignores those the model does not
    read), else the model's own (the ensemble's ``ModelInputs`` drops the others)."""
    check_query_side(model)
    schema = load_workflow(workflow).output_schema if workflow is not None else model.schema

    class Tower(QueryTower):
        # a tf.function __call__ with an input signature: the loaded SavedModel is callable
        # and TF makes serving_default from it, also when Merlin Systems saves it again
        __call__ = tf.function(QueryTower.call, input_signature=[_input_signature(schema)])

    tf.saved_model.save(Tower(model), str(path))
    return str(path)


def retrieval_ensemble(workflow, query_path: str, index_path: str, k: int = 10, label_columns=()):
    """``TransformWorkflow(workflow) >> ModelInputs >> PredictTensorflow(query) >>
    QueryFaiss(index, k)`` (:func:`.ensemble.workflow_and_model`): raw session rows in,
    ``candidate_ids`` (the top-k item ids per session) out; every request is checked
    against the workflow's input schema first (:mod:`.request`)."""
    from merlin.systems.dag.ops.faiss import QueryFaiss

    node, workflow = workflow_and_model(workflow, query_path, label_columns)
    return checked_ensemble(node >> QueryFaiss(str(index_path), topk=k), workflow)


__all__ = [
    "QueryTower",
    "check_query_side",
    "save_query_model",
    "retrieval_ensemble",
    "QUERY_OUTPUT",
]
