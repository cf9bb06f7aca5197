"""The per-item bias of a tied output, sharded exactly like its item table.

A tied output's logits are ``hidden @ W^T + b``: one bias per table row. Where ``W`` is
sharded, so is ``b``: it is the one-column table of a small ``DistributedEmbeddings`` block
of its own, laid out as the item table (:meth:`DistributedEmbeddings.place_like`: same
ranks, same row ranges). Each rank's bias rows are then those of its item rows, which is all
the vocab-parallel loss, top-k and logits need; and as a block it is saved, restored into any
world size, exported and reloaded with the rest of the model's tables.

Example:
    >>> bias = item_bias_block(block["item_id"], "zeros")  # doctest: +SKIP
    >>> rows, offset = bias_rows(bias)  # [R_local] of this rank, first row id  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf
from merlin.schema import ColumnSchema, Schema, Tags


def bias_table_name(table: str) -> str:
    """The bias table's (and its block's) name for item table ``table``."""
    return f"{table}_output_bias"


def item_bias_block(table, initializer="zeros"):
    """A block holding one bias per row of the table handle ``table``, placed like it.

    Built on every rank in the same order (it is made where the output is), so every rank
    agrees on it. Runs on the built-in backend: it is only ever read as local rows.
    """
    name = bias_table_name(table.name)
    column = ColumnSchema(
        name,
        dtype="int64",
        tags=[Tags.CATEGORICAL],
        properties={"domain": {"min": 0, "max": table.input_dim - 1, "name": name}},
    )
    block_cls = type(table.block)  # the item table's own block class (no import cycle)
    block = block_cls(
        Schema([column]),
        dim=1,
        embeddings_initializer=initializer,
        backend="horovod",
        block_name=name,
    )
    block.place_like(table.block.plan, table.name)
    return block


def bias_rows(block):
    """``([R_local] bias of this rank's rows, first row id)``."""
    rows, offset = block[block.tables[0].name].local_rows()
    return tf.reshape(rows, [-1]), offset


__all__ = ["bias_rows", "bias_table_name", "item_bias_block"]
