"""A block restricted to some of its features: what ``block.select_by_tag(...)`` returns.

Merlin's ``ParallelBlock.select_by_tag`` (an input block's, for a two-tower query or item
tower) asks each branch for the part matching the tags; ``mm.Embeddings`` answers with the
matching tables. A ``DistributedEmbeddings`` block is one layer whose lookups are collective,
so its part is a view: it takes the selected features only (as Merlin's input blocks filter
them), and the block runs its whole exchange with placeholder ids for the others (every rank
takes part in every exchange, whatever it selected) and returns the selected outputs. It owns
no variables; the block is its only sublayer.
"""

from __future__ import annotations

import tensorflow as tf
from merlin.models.tf.core.base import Block


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class FeatureSelection(Block):
    """The outputs of ``block`` for ``features`` only."""

    def __init__(self, block, features, **kwargs):
        kwargs.setdefault("name", f"{block.name}_selection")
        super().__init__(**kwargs)
        self.block = block
        self.features = tuple(features)
        unknown = [f for f in self.features if f not in block.schema.column_names]
        if unknown:
            raise ValueError(
                f"Features {unknown} are not embedded by block '{block.name}'. "
                f"Its features: {block.schema.column_names}"
            )
        self.set_schema(block.schema.select_by_name(list(self.features)))

    def call(self, inputs, **kwargs):
        return self.block(inputs, selected=self.features, **kwargs)

    def compute_output_shape(self, input_shapes):
        shapes = self.block.compute_output_shape(input_shapes)
        return {name: shapes[name] for name in self.features}

    def select_by_tag(self, tags):
        selected = [c for c in self.schema.select_by_tag(tags).column_names]
        return self.block.select_by_names_view(selected)

    def get_config(self):
        return dict(
            super().get_config(),
            block=tf.keras.layers.serialize(self.block),
            features=list(self.features),
        )

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        block = tf.keras.layers.deserialize(config.pop("block"))
        return cls(block, **config)


__all__ = ["FeatureSelection"]
