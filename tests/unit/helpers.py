"""Helpers shared by the tests."""
import numpy as np


def cat(name, max_id, *, domain_name=None, multi_hot=False, tags=()):
    """A categorical ColumnSchema with cardinality ``max_id + 1``."""
    from merlin.schema import ColumnSchema, Tags

    domain = {"min": 0, "max": max_id}
    if domain_name:
        domain["name"] = domain_name
    return ColumnSchema(name, tags=[Tags.CATEGORICAL, *tags], dtype=np.int64,
                        properties={"domain": domain}, is_list=multi_hot, is_ragged=multi_hot)
