"""Initializers for one shard of a table: drawn like the whole table, independent of the others.

A rank initializes only its shards, with the shard's shape. Three things keep that faithful to
``mm.Embeddings``' whole tables:

- Fan-based initializers (``glorot_*``, ``he_*``, ``lecun_*``, any ``VarianceScaling``)
  compute their variance from the shape, so a row- or column-slice would start wider or
  narrower than its table; their scale is corrected so the variance is the whole table's.
- Seeds. An unseeded Keras initializer takes its seed from Keras' (or Python's) generator at
  its first call. After ``set_random_seed`` every rank's generator is in the same state, so the
  k-th shard of one rank and the k-th of another would get the same seed: two halves of a
  table (or two tables) starting as copies. On several ranks each shard therefore gets its
  own seed, derived from one base seed (the same on every rank), its table and its offsets.
- Initializers that draw a matrix as one object (``Orthogonal``, ``Identity``) cannot be
  drawn a piece at a time: every rank draws the whole table from the table's seed (the same on
  every rank) and keeps its slice, so the shards are the slices of one whole draw.

On several ranks a large shard with an element-wise initializer is also drawn a block of rows
at a time, into the variable in place (:func:`row_blocks`): memory, not statistics.
"""

from __future__ import annotations

import zlib

import tensorflow as tf

WHOLE_MATRIX = (tf.keras.initializers.Orthogonal, tf.keras.initializers.Identity)
# values drawn independently per element from a distribution that ignores the shape
ELEMENTWISE = (
    tf.keras.initializers.RandomUniform,
    tf.keras.initializers.RandomNormal,
    tf.keras.initializers.TruncatedNormal,
)
# A shard whose draw is larger than this is drawn a block of rows at a time. Drawn whole,
# Keras' uniform holds three shard-sized tensors at once (the draw, its scaling, its shift:
# 3.0x a 640 MB shard's bytes measured, TF 2.12 CPU); on 4 ranks with one 30M-row table each
# that draw, not the trained tables, set every rank's peak (docs/benchmarks.md, "Capacity").
# Small, because where oneDNN is on, TF's CPU allocator keeps what a block freed as its own
# pool, resident for the rest of the run: on a 704 MB shard 64 MB blocks left 0.34 GiB
# behind (0.52 GiB for its bfloat16 half, drawn in float32), 8 MB blocks 0.03 (0.06).
BLOCK_BYTES = 8 << 20


def _fan(shape, mode: str) -> float:
    fan_in, fan_out = float(shape[0]), float(shape[1])
    fan = {"fan_in": fan_in, "fan_out": fan_out}.get(mode, (fan_in + fan_out) / 2.0)
    return max(1.0, fan)


def derived_seed(*parts) -> int:
    """A seed that depends on every part (ints and names), the same in every process."""
    return zlib.crc32(":".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def _reseeded(initializer, seed: int):
    """``initializer`` with ``seed`` (unchanged if it takes none: constants, custom callables)."""
    if not isinstance(initializer, tf.keras.initializers.Initializer):
        return initializer
    config = initializer.get_config()
    if "seed" not in config:
        return initializer
    return type(initializer).from_config({**config, "seed": seed})


class SliceOfWhole(tf.keras.initializers.Initializer):
    """Draws the whole ``table_shape`` matrix and returns the slice at ``start``."""

    def __init__(self, initializer, table_shape, start):
        self.initializer, self.table_shape, self.start = initializer, tuple(table_shape), start

    def __call__(self, shape, dtype=None, **kwargs):
        whole = self.initializer(self.table_shape, dtype=dtype)
        (r, c), (rows, cols) = self.start, shape
        return whole[r : r + rows, c : c + cols]


def for_shard(
    initializer,
    table_shape,
    shard_shape,
    *,
    start=(0, 0),
    table="",
    base_seed=None,
    shared_seed=None,
):
    """``initializer`` as it should be called with ``shard_shape`` to draw like the table.

    Args:
        initializer: The table's Keras initializer (or any callable).
        table_shape, shard_shape: ``(rows, dim)`` of the table and of this shard.
        start: The shard's first ``(row, column)`` in the table.
        table: The table's name.
        base_seed: None in one process (the initializer is used as it is, as in
            ``mm.Embeddings``). On several ranks an int from which each shard's own seed is
            derived with ``table`` and ``start`` (the initializer's own seed replaces it).
        shared_seed: An int or None, the same on every rank: whole-matrix initializers of a
            split table draw the whole table from a seed derived from it (or from their own).
    """
    own = getattr(initializer, "seed", None)
    if isinstance(initializer, WHOLE_MATRIX) and tuple(shard_shape) != tuple(table_shape):
        whole_seed = derived_seed(shared_seed if own is None else own, table)
        return SliceOfWhole(_reseeded(initializer, whole_seed), table_shape, start)
    if base_seed is not None:
        initializer = _reseeded(
            initializer, derived_seed(base_seed if own is None else own, table, *start)
        )
    if tuple(shard_shape) == tuple(table_shape) or not isinstance(
        initializer, tf.keras.initializers.VarianceScaling
    ):
        return initializer
    mode = initializer.mode
    scale = initializer.scale * _fan(shard_shape, mode) / _fan(table_shape, mode)
    return tf.keras.initializers.VarianceScaling(
        scale=scale, mode=mode, distribution=initializer.distribution, seed=initializer.seed
    )


def row_blocks(initializer, shape, dtype, block_bytes: int | None = None):
    """``[(first row, rows, initializer)]`` that draw a shard of ``shape`` a block of rows at
    a time, each block from its own seed (derived from the shard's seed and the block's first
    row); None when the shard is drawn whole: a draw (in :func:`drawn_dtype`) of at most
    ``block_bytes``, an initializer that is not element-wise, or one without a seed (one
    process, where the draw is the one ``mm.Embeddings`` makes)."""
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    rows, cols = (int(d) for d in shape)
    row_bytes = cols * drawn_dtype(dtype).size
    seed = getattr(initializer, "seed", None)
    if rows * row_bytes <= block_bytes or not isinstance(initializer, ELEMENTWISE) or seed is None:
        return None
    per_block = max(1, block_bytes // max(1, row_bytes))
    return [
        (
            first,
            min(per_block, rows - first),
            _reseeded(initializer, derived_seed(seed, "rows", first)),
        )
        for first in range(0, rows, per_block)
    ]


def fill_by_rows(variable, blocks) -> None:
    """Draws each of :func:`row_blocks`' blocks into ``variable`` in place (a block's
    temporaries at a time). Eager, also when the layer is built while a function is traced:
    the fill belongs to initialization, not to the traced step."""
    cols = int(variable.shape[1])
    with tf.init_scope():
        for first, rows, initializer in blocks:
            values = drawn_wide(initializer)((rows, cols), dtype=variable.dtype)
            variable.scatter_update(tf.IndexedSlices(values, tf.range(first, first + rows)))


def drawn_dtype(dtype) -> tf.DType:
    """The dtype a table stored in ``dtype`` is drawn in: float32 for 16-bit tables (the
    draw a float32 table gets, whatever the storage), else ``dtype``."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype.size == 2 else dtype


def drawn_wide(initializer):
    """``initializer`` for a variable of any dtype: a 16-bit table's rows are drawn in
    float32 (:func:`drawn_dtype`) and rounded once."""

    def draw(shape, dtype=None, **kwargs):
        dtype = tf.as_dtype(dtype or tf.float32)
        wide = drawn_dtype(dtype)
        values = initializer(shape, dtype=wide, **kwargs)
        return values if wide == dtype else tf.cast(values, dtype)

    return draw
