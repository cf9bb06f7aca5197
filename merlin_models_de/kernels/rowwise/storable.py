"""16-bit tables' new rows checked against their dtype's range, on every rank together.

A row-wise update computes a 16-bit table's new rows in float32; a value beyond the dtype's
range (float16: 65504) or not finite would be stored as inf and turn to NaN. Each rank sees
only its own shards, so if each rank decided alone, the rank whose shard overflowed would
stop while the others went on to the next step's collectives and waited there forever. So
every rank puts, per table of the blocks it trains, the largest |value| of its new rows (inf
for inf or NaN) into one header (``runtime/agree.py``: one allgather of one float64 per table
a step), and one assertion reads the gathered header: every rank fails with the same message,
naming the table, the ranks and their values, before any row is written.

The tables come from the blocks' :class:`~merlin_models_de.kernels.rounding.RoundedTables` marks, the
same on every rank, so a rank holding none of a block's 16-bit shards sends zeros and still
joins. In one process nothing is exchanged (tables without a block's mark are checked there).

Example:
    >>> check = agreed_storable([(var, new_rows)], variables)  # doctest: +SKIP
"""

from __future__ import annotations

import zlib

import tensorflow as tf

from merlin_models_de.kernels.rounding import largest_magnitude, rounded_tables
from merlin_models_de.runtime import agree
from merlin_models_de.variables import table_mark


def _blocks(variables) -> list:
    """The :class:`RoundedTables` marks of ``variables``, one per block, in variable order
    (the same on every rank: every rank trains the block's anchor)."""
    found: dict = {}
    for var in variables:
        mark = rounded_tables(var)
        if mark is not None and mark.owner not in found:
            found[mark.owner] = mark
    return list(found.values())


def agreed_storable(new_rows, variables) -> list:
    """The assertion every rank runs before writing ``new_rows`` (``[(16-bit table variable,
    its new float32 rows)]``, this rank's), as control dependencies: none when there is nothing
    to check anywhere, or when eager (the check ran, and raised if it failed).
    ``variables``: every variable of the apply (the blocks' marks are read from them)."""
    blocks = _blocks(variables)
    world = max((b.world_size for b in blocks), default=1)
    # (owner, table) -> dtype name, in an order every rank shares
    keys = {(b.owner, t): b.dtype for b in blocks for t in b.tables}
    for var, _ in new_rows:
        key = (table_mark(var).owner, table_mark(var).table)
        if key not in keys and world > 1:
            raise ValueError(
                f"16-bit table '{key[1]}' is updated without its block's other variables: "
                "every rank must check the update's range together, so train the whole block "
                f"with this optimizer. Received: variable={var.name!r}"
            )
        keys.setdefault(key, var.dtype.name)
    if not keys:
        return []
    largest = _local_largest(new_rows, list(keys))
    header = agree.gather_header(
        [tf.bitcast(tf.cast(v, tf.float64), tf.int64) for v in largest], _name(blocks), world
    )
    limits = tf.constant([float(tf.as_dtype(d).max) for d in keys.values()], tf.float64)
    largest_by_rank = tf.bitcast(header, tf.float64)  # [N, tables]
    bad = tf.reduce_any(largest_by_rank > limits, axis=0)
    # the message is built only when a table failed: its string ops would cost every step
    message = tf.cond(
        tf.reduce_any(bad),
        lambda: _message(list(keys.items()), largest_by_rank, bad),
        lambda: tf.constant(""),
    )
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [message], name="storable")
    return [] if check is None else [check]


def _local_largest(new_rows, keys) -> list:
    """Per key ``(owner, table)``: this rank's largest |value| over its new rows of that
    table (inf for inf or NaN, 0 without any)."""
    found: dict = {k: [] for k in keys}
    for var, rows in new_rows:
        found[(table_mark(var).owner, table_mark(var).table)].append(largest_magnitude(rows))
    return [tf.reduce_max(tf.stack(found[k])) if found[k] else tf.constant(0.0) for k in keys]


def _name(blocks) -> str:
    """The header's collective name: the same on every rank, its own per set of blocks."""
    prefixes = ",".join(sorted(b.prefix for b in blocks)).encode()
    return f"mmde_storable_{zlib.crc32(prefixes):08x}"


def _message(keys, largest, bad):
    """Every table with a value out of range (``bad [tables]``), its dtype, the ranks and each
    rank's largest |value| (``largest [N, tables]``), one line each."""
    ranks = tf.range(tf.shape(largest, out_type=tf.int64)[0])
    lines = []
    for k, ((_, table), dtype) in enumerate(keys):
        limit = float(tf.as_dtype(dtype).max)
        lines.append(
            tf.strings.join(
                [
                    f"Table '{table}' is stored in {dtype} (table_dtype), whose largest value "
                    f"is {limit:g}; the update would write values beyond it or inf/NaN on "
                    "rank(s) ",
                    _listed(tf.strings.as_string(tf.boolean_mask(ranks, largest[:, k] > limit))),
                    ", so the step stops on every rank, writing nothing. Lower the learning "
                    "rate, or store the table in bfloat16 or float32. Largest |value| of its "
                    "new rows: ",
                    _listed(tf.strings.as_string(largest[:, k], shortest=True)),
                    " (one per rank).",
                ]
            )
        )
    return tf.strings.reduce_join(tf.boolean_mask(tf.stack(lines), bad), separator="\n")


def _listed(strings):
    return tf.strings.join(["[", tf.strings.reduce_join(strings, separator=", "), "]"])
