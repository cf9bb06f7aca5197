"""A shard starts with the distribution of its whole table (fan-based initializers corrected),
with a seed of its own on several ranks, and whole-matrix initializers give slices of one
whole draw."""

import os

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de.backends.shard_init import SliceOfWhole, for_shard


@pytest.mark.parametrize(
    "name, mode, table, shard, scale",
    [
        ("glorot_uniform", "fan_avg", (64, 64), (64, 32), 96 / 128),  # column slice
        ("glorot_normal", "fan_avg", (4000, 16), (2000, 16), 2016 / 4016),  # row slice
        ("he_uniform", "fan_in", (4000, 16), (2000, 16), 2000 / 4000),  # He: 2 x 0.5
        ("lecun_normal", "fan_in", (64, 64), (64, 32), 1.0),  # fan_in is the rows: unchanged
    ],
)
def test_variance_scaling_gets_the_whole_tables_variance(name, mode, table, shard, scale):
    init = tf.keras.initializers.get(name)
    got = for_shard(init, table, shard)
    assert isinstance(got, tf.keras.initializers.VarianceScaling)
    expected = init.scale * scale
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


@pytest.mark.parametrize(
    "init", ["uniform", tf.keras.initializers.TruncatedNormal(stddev=0.05), "zeros"]
)
def test_shape_independent_initializers_are_kept(init):
    init = tf.keras.initializers.get(init)
    assert for_shard(init, (4000, 16), (2000, 16)) is init


def test_whole_shard_keeps_the_initializer_object():
    init = tf.keras.initializers.GlorotUniform(seed=1)
    assert for_shard(init, (10, 4), (10, 4)) is init


def test_orthogonal_shards_are_slices_of_one_whole_draw():
    """Two ranks' row halves (same shared seed) stack to one orthogonal 64 x 16 table."""
    init = tf.keras.initializers.Orthogonal()
    halves = []
    for start in ((0, 0), (32, 0)):
        got = for_shard(
            init, (64, 16), (32, 16), start=start, table="t", base_seed=11, shared_seed=5
        )
        assert isinstance(got, SliceOfWhole)
        halves.append(got((32, 16)).numpy())
    table = np.concatenate(halves)
    np.testing.assert_allclose(table.T @ table, np.eye(16), atol=1e-5)


def test_each_shard_gets_its_own_seed_on_several_ranks():
    """The same base seed on every rank: shards differ by table and offset, and the same
    shard draws the same values again (reproducible)."""
    init = tf.keras.initializers.get("uniform")

    def draw(table, start):
        return for_shard(init, (64, 8), (32, 8), start=start, table=table, base_seed=7)(
            (32, 8)
        ).numpy()

    first, second, other = draw("t", (0, 0)), draw("t", (32, 0)), draw("u", (0, 0))
    assert np.abs(first - second).max() > 0.01 and np.abs(first - other).max() > 0.01
    np.testing.assert_array_equal(first, draw("t", (0, 0)))
    # one process (no base seed): the initializer itself, as mm.Embeddings uses it
    assert for_shard(init, (64, 8), (64, 8)) is init


def test_a_large_shard_is_drawn_a_block_of_rows_at_a_time():
    from merlin_models_de.backends.shard_init import row_blocks

    uniform = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=9)
    blocks = row_blocks(uniform, (100, 8), tf.float32, block_bytes=32 * 8 * 4)
    assert [(first, rows) for first, rows, _ in blocks] == [(0, 32), (32, 32), (64, 32), (96, 4)]
    seeds = [init.seed for _, _, init in blocks]
    assert len(set(seeds)) == 4 and all(type(init) is type(uniform) for _, _, init in blocks)
    assert [init.get_config()["maxval"] for _, _, init in blocks] == [0.05] * 4
    # drawn whole: small enough, a whole-matrix or shape-dependent initializer, no seed
    assert row_blocks(uniform, (32, 8), tf.float32, block_bytes=32 * 8 * 4) is None
    assert row_blocks(tf.keras.initializers.Orthogonal(seed=1), (100, 8), tf.float32, 64) is None
    assert row_blocks(tf.keras.initializers.GlorotUniform(seed=1), (100, 8), tf.float32, 64) is None
    assert row_blocks(tf.keras.initializers.RandomUniform(), (100, 8), tf.float32, 64) is None


def test_blocks_are_filled_in_place_once_also_when_built_inside_a_traced_function():
    from merlin_models_de.backends.shard_init import fill_by_rows, row_blocks

    uniform = tf.keras.initializers.RandomNormal(stddev=0.1, seed=4)
    blocks = row_blocks(uniform, (50, 4), tf.float32, block_bytes=16 * 4 * 4)
    want = np.concatenate([init((rows, 4)).numpy() for _, rows, init in blocks])

    class Table(tf.keras.layers.Layer):
        def build(self, input_shape):
            self.table = self.add_weight(name="t", shape=(50, 4), initializer="zeros")
            fill_by_rows(self.table, blocks)

        def call(self, ids):
            return tf.gather(self.table, ids)

    layer = Table()
    step = tf.function(lambda ids: layer(ids))
    step(tf.constant([0, 49]))  # built while tracing
    np.testing.assert_array_equal(layer.table.numpy(), want)
    layer.table.assign_add(tf.ones([50, 4]))
    step(tf.constant([1]))  # the traced step does not draw again
    np.testing.assert_array_equal(layer.table.numpy(), want + 1)
    assert np.abs(want[:16] - want[16:32]).max() > 0.01  # blocks are independent draws


def test_drawing_by_blocks_holds_one_copy_of_a_large_shard(tmp_path):
    """Peak memory of a 640 MB shard: whole, Keras' uniform holds 3 copies at once; by blocks
    of 8 MB, the variable and one block's temporaries. The peak is the kernel's VmHWM, reset
    after the imports (whose own transient, e.g. a first import compiling caches, would
    otherwise hide what follows).

    Where TF turns oneDNN on (x86 CPUs with AVX512-VNNI or newer), its CPU allocator keeps
    freed blocks in a pool, so the blocks' temporaries stay resident (1.70x with 64 MB
    blocks, 3.23x whole): the draw is measured with oneDNN off (the plain allocator returns
    what is freed) and with the default, both at most 1.25x."""
    import subprocess
    import sys

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident size")
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "import tensorflow as tf\n"
        "from merlin_models_de.backends.shard_init import fill_by_rows, row_blocks\n"
        "def status(key):\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith(key))\n"
        "    return int(line.split()[1]) * 1024\n"
        "shape, size = (10_000_000, 16), 10_000_000 * 16 * 4\n"
        "init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=3)\n"
        "open('/proc/self/clear_refs', 'w').write('5')  # the peak starts again from here\n"
        "base = status('VmRSS:')\n"
        "if sys.argv[1] == 'whole':\n"
        "    v = tf.Variable(init(shape))\n"
        "else:\n"
        "    v = tf.Variable(tf.zeros(shape))\n"
        "    fill_by_rows(v, row_blocks(init, shape, tf.float32))\n"
        "print((status('VmHWM:') - base) / size)\n"
    )

    def peaks(onednn: str) -> dict:
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn}
        return {
            how: float(
                subprocess.run(
                    [sys.executable, str(probe), how],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=env,
                ).stdout.split()[-1]
            )
            for how in ("whole", "blocks")
        }

    copies = peaks("0")
    assert 0.9 < copies["blocks"] < 1.25 < 2.5 < copies["whole"], copies
    pooled = peaks(os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"))
    assert 0.9 < pooled["blocks"] < 1.25 < 2.5 < pooled["whole"], pooled
