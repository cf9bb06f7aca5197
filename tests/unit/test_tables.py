"""Schema -> TableSpec: rows, shared tables, dims, combiners and the errors."""

import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de.tables import FeatureSpec, TableSpec, feature_order, tables_from_schema
from tests.schemas import cat


def test_rows_are_max_plus_one_and_targets_are_skipped():
    schema = Schema(
        [
            cat("user", 99),
            cat("item", 9),
            cat("click", 1, tags=[Tags.TARGET]),
            ColumnSchema("price", tags=[Tags.CONTINUOUS], dtype=np.float32),
        ]
    )
    tables = tables_from_schema(schema, dim=8)
    assert [(t.name, t.rows, t.dim) for t in tables] == [("user", 100, 8), ("item", 10, 8)]
    assert tables[0].features == (FeatureSpec("user", "user", False, None),)


def test_shared_domain_name_gives_one_table_with_both_features():
    schema = Schema(
        [
            cat("genres", 50, domain_name="genres", multi_hot=True),
            cat("fav_genre", 50, domain_name="genres"),
            cat("item", 9),
        ]
    )
    tables = tables_from_schema(schema, dim=4, combiner="sum")
    assert [t.name for t in tables] == ["genres", "item"]
    assert tables[0].features == (
        FeatureSpec("genres", "genres", True, "sum"),
        FeatureSpec("fav_genre", "genres", False, None),
    )
    assert [f.name for f in feature_order(tables)] == ["genres", "fav_genre", "item"]


def test_dim_dict_by_feature_or_table_and_inferred_dim():
    schema = Schema([cat("a", 999), cat("b", 9, domain_name="shared"), cat("c", 9)])
    tables = tables_from_schema(schema, dim={"a": 32, "shared": 4}, infer_dim_fn=lambda c: 7)
    assert [t.dim for t in tables] == [32, 4, 7]
    # Merlin's default heuristic: ceil(2 * cardinality ** 0.25) rounded up to a multiple of 8
    assert tables_from_schema(Schema([cat("a", 9999)]))[0].dim == 24


def test_combiner_per_feature_and_unpooled():
    schema = Schema([cat("a", 9, multi_hot=True), cat("b", 9, multi_hot=True), cat("c", 9)])
    tables = tables_from_schema(schema, dim=2, combiner={"a": "sqrtn", "b": None})
    assert [t.features[0].combiner for t in tables] == ["sqrtn", None, None]
    assert [t.features[0].multi_hot for t in tables] == [True, True, False]


def test_table_spec_round_trip_and_bytes():
    t = tables_from_schema(Schema([cat("a", 9, multi_hot=True)]), dim=3)[0]
    assert TableSpec.from_dict(t.to_dict()) == t
    assert t.bytes() == 10 * 3 * 4


@pytest.mark.parametrize(
    "column, message",
    [
        (
            ColumnSchema("nodomain", tags=[Tags.CATEGORICAL], dtype=np.int64),
            "Categorical column 'nodomain' has no cardinality",
        ),
        (
            cat("zero", 0),
            "Categorical column 'zero' needs int_domain.max > 0. Received: int_domain.max=0",
        ),
    ],
)
def test_bad_cardinality_names_the_column(column, message):
    with pytest.raises(ValueError, match=message):
        tables_from_schema(Schema([column]), dim=4)


def test_a_raw_string_column_points_at_categorify():
    raw = ColumnSchema("item_id", tags=[Tags.CATEGORICAL], dtype=str)
    with pytest.raises(
        ValueError,
        match=r"Categorical column 'item_id' has no cardinality.*"
        r"NVTabular's Categorify.*Received: dtype='str",
    ):
        tables_from_schema(Schema([raw]), dim=4)
    score = ColumnSchema("score", dtype=np.float32)
    with pytest.raises(ValueError, match=r"'score' has no cardinality.*tag it CONTINUOUS"):
        tables_from_schema(Schema([score]), dim=4)


def test_shared_table_disagreeing_on_rows_or_dim():
    schema = Schema([cat("a", 9, domain_name="g"), cat("b", 19, domain_name="g")])
    with pytest.raises(
        ValueError, match=r"'a' and 'b' share table 'g' but disagree on rows: 10 != 20"
    ):
        tables_from_schema(schema, dim=4)
    schema = Schema([cat("a", 9, domain_name="g"), cat("b", 9, domain_name="g")])
    with pytest.raises(ValueError, match=r"disagree on dim: 4 != 8. Received: dim=8 for 'b'"):
        tables_from_schema(schema, dim={"a": 4, "b": 8})


def test_unknown_combiner_and_unknown_dim_key():
    schema = Schema([cat("a", 9, multi_hot=True)])
    with pytest.raises(ValueError, match=r"feature 'a'.*Received: combiner='max'"):
        tables_from_schema(schema, dim=4, combiner="max")
    with pytest.raises(
        ValueError, match=r"dim names features or tables that are not in the schema: \['nope'\]"
    ):
        tables_from_schema(schema, dim={"nope": 4})
    with pytest.raises(
        ValueError, match=r"dim for feature 'a' must be a positive int. Received: dim=0"
    ):
        tables_from_schema(schema, dim=0)


def test_schema_without_categorical_columns():
    schema = Schema([ColumnSchema("price", tags=[Tags.CONTINUOUS], dtype=np.float32)])
    with pytest.raises(ValueError, match=r"no categorical, non-target columns.*\['price'\]"):
        tables_from_schema(schema)


def test_synthetic_schemas(synthetic_schema):
    criteo = tables_from_schema(synthetic_schema("criteo"), dim=16)
    assert len(criteo) == 26 and sum(t.rows for t in criteo) == 45_621_194
    music = tables_from_schema(synthetic_schema("music-streaming"), dim=8)
    genres = [t for t in music if t.name == "genres"]
    assert len(genres) == 1 and len(genres[0].features) == 2
    assert any(f.multi_hot and f.combiner == "mean" for f in genres[0].features)
