"""A request the served workflow cannot read (serving/request.py) is refused before the
workflow runs: a missing column, no rows, or a value of the wrong kind or shape, each named
with what the workflow expects and what was received."""

import pandas as pd
import pytest
from merlin.schema import ColumnSchema, Schema

from merlin_models_de.serving.request import RequestError, check_request

SCHEMA = Schema(
    [
        ColumnSchema("user", dtype="str"),
        ColumnSchema("age", dtype="float32"),
        ColumnSchema("tags", dtype="int64", is_list=True, is_ragged=True),
    ]
)


def _request(**columns):
    base = {"user": ["u-1"], "age": [31.0], "tags": [[1, 2]]}
    return pd.DataFrame({**base, **columns})


def test_a_request_of_the_right_kinds_passes():
    check_request(_request(), SCHEMA)
    check_request(_request(age=[31]), SCHEMA)  # integers where floats are read
    check_request(_request(user=[None]), SCHEMA)  # all null: the null id


def test_a_missing_column_is_named_with_its_kind():
    with pytest.raises(RequestError, match=r"missing columns.*age \(float \(float32\)\)"):
        check_request(_request().drop(columns=["age"]), SCHEMA)


def test_no_rows_and_wrong_kinds_or_shapes_are_refused():
    with pytest.raises(RequestError, match="no rows"):
        check_request(_request().iloc[:0], SCHEMA)
    with pytest.raises(RequestError, match=r"'age': expected float \(float32\), received string"):
        check_request(_request(age=["old"]), SCHEMA)
    with pytest.raises(RequestError, match="'tags': expected lists of int"):
        check_request(_request(tags=[3]), SCHEMA)
