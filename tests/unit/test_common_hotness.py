"""--hotness of the commands (apps/common/hotness.py): parsed, checked, and resolved against
the schema with one line saying where each feature's value came from."""

import pytest
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_models_de.apps.common.hotness import parse_hotness, resolve_hotness
from merlin_models_de.tables import FeatureSpec

TAGS = FeatureSpec("tags", "tags", multi_hot=True, combiner="sum")
GENRES = FeatureSpec("genres", "genres", multi_hot=True, combiner="sum")
USER = FeatureSpec("user", "user")


def _schema():
    def column(name, **props):
        return ColumnSchema(name, tags=[Tags.CATEGORICAL], dtype="int64", **props)

    return Schema(
        [
            column("user"),
            column("tags", is_list=True, is_ragged=True),
            column("genres", is_list=True, is_ragged=True, properties={"value_count": {"max": 3}}),
        ]
    )


def test_parse_one_number_or_pairs():
    assert parse_hotness(None) is None
    assert parse_hotness("3") == 3.0
    assert parse_hotness("a=2, b=5.5") == {"a": 2.0, "b": 5.5}


@pytest.mark.parametrize("bad", ["inf", "-1", "x", "a=nan", "=2"])
def test_bad_values_name_the_option_and_what_was_received(bad):
    with pytest.raises(ValueError, match=f"Received: --hotness={bad!r}"):
        parse_hotness(bad)


def test_resolved_from_the_option_then_the_schema_then_the_default():
    features = [USER, TAGS, GENRES]
    used, line = resolve_hotness("tags=2", _schema(), features, default=4.0)
    assert used == {"tags": 2.0, "genres": 3.0}
    assert line == "hotness: tags=2 (--hotness), genres=3 (schema value_count.max)"
    used, line = resolve_hotness(None, _schema(), features, default=4.0)
    assert used == {"tags": 4.0, "genres": 3.0} and "tags=4 (assumed)" in line
    with pytest.raises(ValueError, match="'tags' has no value_count"):
        resolve_hotness(None, _schema(), features)
    with pytest.raises(ValueError, match=r"Received: \['user'\]"):
        resolve_hotness("user=2", _schema(), features)
