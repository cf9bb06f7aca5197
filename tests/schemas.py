"""Small Merlin schemas and synthetic datasets for the tests (unit and ranks)."""

import numpy as np


def cat(name, max_id, *, domain_name=None, multi_hot=False, tags=()):
    """A categorical ColumnSchema with cardinality ``max_id + 1``."""
    from merlin.schema import ColumnSchema, Tags

    domain = {"min": 0, "max": max_id}
    if domain_name:
        domain["name"] = domain_name
    return ColumnSchema(
        name,
        tags=[Tags.CATEGORICAL, *tags],
        dtype=np.int64,
        properties={"domain": domain},
        is_list=multi_hot,
        is_ragged=multi_hot,
    )


def capped_schema(schema, max_id=999):
    """``schema`` with every categorical cardinality capped at ``max_id + 1`` (fast tests)."""
    from merlin_models_de.apps.common.synthetic import capped_schema as cap

    return cap(schema, max_id + 1)


def synthetic(name, rows, max_id=999):
    """A Merlin synthetic dataset with capped cardinalities."""
    from merlin.datasets.synthetic import generate_data

    from merlin_models_de.apps.common.schemas import synthetic_schema

    return generate_data(capped_schema(synthetic_schema(name), max_id), rows)
