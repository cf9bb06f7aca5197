"""A shard starts with the distribution of its whole table (fan-based initializers corrected),
and tables that only whole-matrix initializers can draw are not split."""
import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.backends.shard_init import check_sliceable, for_shard
from merlin_models_de.planner import ShardingType, plan
from merlin_models_de.tables import FeatureSpec, TableSpec


def specs(*shapes):
    return [TableSpec(f"t{i}", r, d, (FeatureSpec(f"t{i}", f"t{i}"),))
            for i, (r, d) in enumerate(shapes)]


@pytest.mark.parametrize("name, mode, table, shard, scale", [
    ("glorot_uniform", "fan_avg", (64, 64), (64, 32), 96 / 128),  # column slice
    ("glorot_normal", "fan_avg", (4000, 16), (2000, 16), 2016 / 4016),  # row slice
    ("he_uniform", "fan_in", (4000, 16), (2000, 16), 4.0),  # He: scale 2 x 2000 / 4000
    ("lecun_normal", "fan_in", (64, 64), (64, 32), 1.0),  # fan_in is the rows: unchanged
])
def test_variance_scaling_gets_the_whole_tables_variance(name, mode, table, shard, scale):
    init = tf.keras.initializers.get(name)
    got = for_shard(init, table, shard)
    assert isinstance(got, tf.keras.initializers.VarianceScaling)
    expected = init.scale * scale if name != "he_uniform" else 1.0  # he: 2 * 2000/4000
    assert (got.mode, got.distribution) == (mode, init.distribution)
    assert got.scale == pytest.approx(expected, rel=1e-12)
    # the variance Keras computes from the shard's shape is the table's
    fan = {"fan_in": lambda s: s[0], "fan_avg": lambda s: (s[0] + s[1]) / 2}[mode]
    assert got.scale / fan(shard) == pytest.approx(init.scale / fan(table), rel=1e-12)


def test_uniform_glorot_shard_spans_the_tables_limit():
    """Drawn values: the shard's largest |w| is the table's Glorot limit, not the shard's."""
    table, shard = (64, 64), (64, 32)
    values = for_shard(tf.keras.initializers.GlorotUniform(seed=3), table, shard)(shard)
    limit = np.sqrt(6 / (64 + 64))
    top = np.abs(values.numpy()).max()
    assert limit * 0.99 < top <= limit * (1 + 1e-6)  # the shard's own limit would be 0.25


@pytest.mark.parametrize("init", ["uniform", tf.keras.initializers.TruncatedNormal(stddev=0.05),
                                  "zeros"])
def test_shape_independent_initializers_are_kept(init):
    init = tf.keras.initializers.get(init)
    assert for_shard(init, (4000, 16), (2000, 16)) is init


def test_whole_shard_keeps_the_initializer_object():
    init = tf.keras.initializers.GlorotUniform(seed=1)
    assert for_shard(init, (10, 4), (10, 4)) is init


def test_orthogonal_on_a_split_table_is_refused():
    p = plan(specs((4000, 16), (10, 4)), 2, "basic", row_slice_threshold=50_000)
    assert p.kind_of("t0") is ShardingType.ROW_WISE
    inits = {"t0": tf.keras.initializers.Orthogonal(), "t1": tf.keras.initializers.Orthogonal()}
    with pytest.raises(ValueError, match=(
            r"Table 't0' is split across ranks \(row_wise, shard 2000x16 of 4000x16\) but its "
            r"embeddings_initializer Orthogonal draws the whole matrix at once")):
        check_sliceable(p, inits.get)
    # a table kept whole (t1) may use it
    whole = plan(specs((10, 4), (12, 4)), 2, "basic", column_slice_threshold=10_000)
    assert {s.kind for s in whole.shards} == {ShardingType.TABLE_WISE}
    check_sliceable(whole, inits.get)
