"""Synthetic data per rank (apps/common/synthetic.py): a row depends on its index and the seed
only, so N ranks of batch B see the rows one process of batch N*B sees; ids stay in their
tables; a capped schema shrinks the tables."""

import numpy as np
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de.apps.common.synthetic import (
    BLOCK_ROWS,
    capped_schema,
    make_rows,
    rank_rows,
)

SCHEMA = Schema(
    [
        ColumnSchema("user", dtype="int64", tags=[Tags.CATEGORICAL],
                     properties={"domain": {"min": 0, "max": 99, "name": "user"}}),
        ColumnSchema("age", dtype="float32", tags=[Tags.CONTINUOUS]),
        ColumnSchema("click", dtype="int32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]),
    ]
)  # fmt: skip


def test_ranks_together_see_the_rows_of_one_process():
    total = 2 * BLOCK_ROWS + 10  # global batches across a block boundary, a short tail
    one = make_rows(SCHEMA, rank_rows(total, 8, 1, 0), seed=3)
    ranks = [make_rows(SCHEMA, rank_rows(total, 4, 2, r), seed=3) for r in range(2)]
    for name in ("user", "age", "click"):
        both = np.stack([ranks[0][name].reshape(-1, 4), ranks[1][name].reshape(-1, 4)], 1)
        np.testing.assert_array_equal(both.reshape(-1), one[name][: both.size])
    assert len(one["user"]) == total - total % 8  # rows after the last full batch: nobody's
    assert one["user"].min() >= 0 and one["user"].max() <= 99
    assert set(np.unique(one["click"])) == {0, 1}
    assert not np.array_equal(make_rows(SCHEMA, [(0, 50)], seed=4)["age"], one["age"][:50])


def test_rank_rows_are_each_ranks_slice_of_every_full_global_batch():
    assert rank_rows(10, per_rank=2, world_size=2, rank=1) == [(2, 4), (6, 8)]
    assert rank_rows(3, per_rank=2, world_size=2, rank=0) == []


def test_a_capped_schema_scales_then_cuts_the_tables():
    assert capped_schema(SCHEMA, None) is SCHEMA
    assert capped_schema(SCHEMA, 10)["user"].int_domain.max == 9
    scaled = capped_schema(SCHEMA, None, scale=2.5)["user"].int_domain
    assert (scaled.max, scaled.name) == (249, "user")
