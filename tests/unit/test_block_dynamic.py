"""The block's dynamic tables (merlin_models_de/block/dynamic.py): the backend that runs
them, and their options through the block's config."""

import merlin.dtypes as md
import pytest
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de import DynamicTable
from merlin_models_de.block.layer import DistributedEmbeddings
from tests.schemas import cat


def schema():
    return Schema([cat("user", 9), ColumnSchema("item", dtype=md.int64, tags=[Tags.CATEGORICAL])])


def block(**options):
    return DistributedEmbeddings(
        schema(), dim=3, dynamic_tables={"item": DynamicTable(capacity=5, **options)}
    )


def test_another_backend_refuses_dynamic_tables():
    with pytest.raises(NotImplementedError, match="Received: backend='distributed-embeddings'"):
        DistributedEmbeddings(
            schema(),
            dim=3,
            backend="distributed-embeddings",
            dynamic_tables={"item": DynamicTable(capacity=5)},
        )


def test_the_config_holds_the_options():
    emb = block(admit_after=2)
    copy = DistributedEmbeddings.from_config(emb.get_config())
    assert copy.dynamic_tables == {"item": DynamicTable(capacity=5, admit_after=2)}
    assert next(t for t in copy.tables if t.name == "item").rows == 5


def test_dynamic_tables_must_be_a_dict():
    with pytest.raises(ValueError, match="Received: dynamic_tables=\\['item'\\]"):
        DistributedEmbeddings(schema(), dim=3, dynamic_tables=["item"])
