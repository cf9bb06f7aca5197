"""Ids per sample for the planner's estimates (planner/hotness.py): the caller's value, else
the schema's, else the default; bad values and misspelt feature names are named."""

import math

import pytest

from merlin_models_de.planner.hotness import DEFAULT_MULTI_HOT, check_hotness, ids_per_sample
from merlin_models_de.tables import FeatureSpec

ONE = FeatureSpec("user", "user")
MULTI = FeatureSpec("tags", "tags", multi_hot=True, combiner="sum")
DECLARED = FeatureSpec("genres", "genres", multi_hot=True, combiner="sum", hotness=3.0)


def test_caller_then_schema_then_default():
    assert ids_per_sample(ONE, 9) == 1.0
    assert ids_per_sample(MULTI, 2) == 2.0
    assert ids_per_sample(MULTI, {"tags": 0.5}) == 0.5
    assert ids_per_sample(MULTI, {"other": 7}) == DEFAULT_MULTI_HOT
    assert ids_per_sample(DECLARED, None) == 3.0
    assert ids_per_sample(DECLARED, {"genres": 6}) == 6.0


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan, True, "4"])
def test_bad_values_are_named_with_what_was_received(bad):
    with pytest.raises(ValueError, match="Received: hotness="):
        check_hotness(bad)
    with pytest.raises(ValueError, match="feature 'tags'"):
        check_hotness({"tags": bad})


def test_a_misspelt_feature_is_named_with_the_multi_hot_ones():
    check_hotness({"tags": 2, "genres": None}, [ONE, MULTI, DECLARED])
    with pytest.raises(ValueError, match=r"\['tagz'\].*\['tags', 'genres'\]"):
        check_hotness({"tagz": 2}, [ONE, MULTI, DECLARED])
