"""Value-only hashing (serving/hashing.py): a value's id is the same in any row, batch or
integer width, nulls take the null id, and ids stay within the buckets."""

import numpy as np
import pandas as pd

from merlin_models_de.serving.hashing import bucket_ids, value_hash


def test_a_value_hashes_the_same_in_every_row_and_batch():
    batch = value_hash(np.array(["u-1", "u-2", "u-1", "u-1"], dtype=object))
    assert batch[0] == batch[2] == batch[3] != batch[1]
    assert value_hash(np.array(["u-1"], dtype=object))[0] == batch[0]
    assert value_hash(np.array([7], np.int8))[0] == value_hash(np.array([7], np.int64))[0]
    assert value_hash(np.array([7], np.int64))[0] != value_hash(np.array([7.0]))[0]


def test_bucket_ids_leave_0_for_padding_and_1_for_nulls():
    values = pd.Series(["a", None, "b", "a", np.nan], dtype=object)
    ids = bucket_ids(values, 10)
    assert ids.dtype == np.int64
    assert ids[1] == ids[4] == 1 and ids[0] == ids[3]
    present = ids[[0, 2, 3]]
    assert ((present >= 2) & (present < 12)).all()
    many = bucket_ids(np.arange(2000), 10)
    assert set(many) == set(range(2, 12))  # every bucket used, none outside
