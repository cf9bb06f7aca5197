"""The input checks before the exchange (backends/validate.py), in one process: a missing or
malformed feature becomes a placeholder and a counted problem (never a lone raise), ids outside
their table and an empty batch are counted, each check's message names the feature and value."""

import numpy as np
import tensorflow as tf

from merlin_models_de.backends.validate import (
    batch_size,
    ids_outside,
    local_problems,
    one_id_per_sample,
    ordered_inputs,
)
from merlin_models_de.tables import FeatureSpec, TableSpec

USER = FeatureSpec("user", "user")
TAGS = FeatureSpec("tags", "tags", multi_hot=True, combiner="sum")
TABLES = {"user": TableSpec("user", 10, 4, (USER,)), "tags": TableSpec("tags", 5, 4, (TAGS,))}


def _text(data):
    return " ".join(d if isinstance(d, str) else str(np.asarray(d).tolist()) for d in data)


def test_a_missing_feature_is_a_placeholder_and_a_problem():
    inputs = {"user": tf.constant([1, 2, 3], tf.int64)}
    ordered, problems = ordered_inputs(inputs, [USER, TAGS])
    assert len(problems) == 1 and "'tags'" in problems[0] and "['user']" in problems[0]
    ids, lengths = ordered[1]
    assert ids.shape[0] == 0 and lengths.numpy().tolist() == [0, 0, 0]  # the batch's samples
    assert int(batch_size(ordered)) == 3


def test_ids_outside_their_table_are_counted_and_named():
    inputs = {
        "user": tf.constant([1, 12, 3], tf.int64),
        "tags": tf.ragged.constant([[0, 7], [], [-1]], tf.int64),
    }
    ordered, problems = ordered_inputs(inputs, [USER, TAGS])
    assert problems == []
    assert ids_outside(ordered, [USER, TAGS], TABLES).numpy().tolist() == [1, 2]
    count, checks = local_problems(ordered, [USER, TAGS], TABLES, batch_size(ordered))
    assert int(count) == 3
    failed = [_text(data) for ok, data in checks if not bool(ok)]
    assert len(failed) == 1 and "feature= b'user' id= 12" in failed[0]
    count, _ = local_problems(ordered, [USER, TAGS], TABLES, 3, check_ids=False)
    assert int(count) == 0


def test_an_empty_batch_is_a_problem_where_samples_are_required():
    ordered, _ = ordered_inputs({"user": tf.zeros([0], tf.int64)}, [USER])
    assert int(local_problems(ordered, [USER], TABLES, batch_size(ordered))[0]) == 1
    assert int(local_problems(ordered, [USER], TABLES, 0, require_samples=False)[0]) == 0


def test_a_one_hot_input_of_unknown_width_is_checked_at_run_time():
    first, (ok, data) = one_id_per_sample(tf.constant([[4, 5], [6, 7]], tf.int64), "user")
    assert first.numpy().tolist() == [4, 6] and not bool(ok)
    assert "Feature 'user'" in _text(data) and "[2, 2]" in _text(data)
    first, (ok, _) = one_id_per_sample(tf.constant([[[4]], [[6]]], tf.int64), "user")
    assert first.numpy().tolist() == [4, 6] and bool(ok)
