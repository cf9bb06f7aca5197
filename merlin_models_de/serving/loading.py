"""A saved model back in one process, as the Merlin model it was: every Keras class of the
package registered first, and a retrieval model's encoders ready for Merlin's top-k encoder.

Example:
    >>> model = load_model("out/model")  # model.save under horovodrun, rank 0  # doctest: +SKIP
    >>> model.schema  # doctest: +SKIP
"""

from __future__ import annotations


def load_model(path: str):
    """The model ``model.save(path)`` wrote, in this process. The package's layers register
    with Keras when their modules load, which is lazy: without them Keras cannot rebuild
    the model from its config and revives a bare copy without Merlin's methods (no
    ``schema``, no ``blocks``), so every one of them is loaded first."""
    import merlin.models.tf  # noqa: F401  (attaches mm.DistributedEmbeddings)
    import tensorflow as tf

    from merlin_models_de.merlin.register import load_keras_classes

    load_keras_classes()

    # the package saves an uncompiled copy: compile=False, or Keras warns that it found no
    # training configuration (compile the model to train it further)
    return with_built_encoders(tf.keras.models.load_model(str(path), compile=False))


def with_built_encoders(model):
    """``model`` with the encoders of a Merlin retrieval model (``RetrievalModelV2``: the
    query tower, and a two-tower model's candidate tower) called once on a small batch of
    its schema. Keras revives them unbuilt, and Merlin's ``to_top_k_encoder`` saves the
    candidate tower and wraps the query tower, both of which need the input shape that only
    a call gives ("input shape is not available"). Other models: unchanged."""
    from merlin.models.tf.models.base import RetrievalModelV2

    from merlin_models_de.persistence.export import batch_like, sample_batch

    if not isinstance(model, RetrievalModelV2):
        return model
    encoders = [model.query_encoder]
    if model.has_candidate_encoder:
        encoders.append(model.candidate_encoder)
    batch = batch_like(model, sample_batch(model.schema))
    for encoder in encoders:
        names = set(encoder.schema.column_names)
        encoder({k: v for k, v in batch.items() if column_of(k) in names}, training=False)
    return model


def column_of(key: str) -> str:
    """The column a model input is part of: ``item_id_list__values`` -> ``item_id_list``."""
    for suffix in ("__values", "__offsets"):
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


__all__ = ["column_of", "load_model", "with_built_encoders"]
