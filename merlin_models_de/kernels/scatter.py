"""Sparse row updates of a table on a CPU: adds in pieces that TensorFlow applies in a plain
loop, and Adagrad's rows gathered, updated and written back.

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

Adagrad: TF's fused CPU kernel ``ResourceSparseApplyAdagradV2`` updates a table's rows one at
a time, the accumulator row then the table row, each waiting for its memory. Gathering the
rows, updating them as whole tensors and writing them back (``ResourceScatterUpdate``: a copy
per row) does the same arithmetic in the same order, so the result is the same floats.
Measured like the scatters above (1,024 unique rows of 16, 13 tables a call, huge pages), the
fused kernel against the write-back: 159-177 us against 120-145 us a table of 10M rows,
112-117 against 84-89 at 100k rows, and 8-9 against 10-11 for 50 rows of a 1k-row table (the
write-back's few more ops). On a GPU Keras' fused kernel stays. ``RowWiseAdagrad`` writes its
rows and row accumulators back the same way (:func:`write_rows`), on any device.

Example:
    >>> scatter_in_pieces(add, var.device, ids, rows)  # doctest: +SKIP
    >>> adagrad_rows(var, accumulator, ids, grad, lr, epsilon)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

PIECE_ROWS = 1023  # TF's CPU scatter kernels loop over fewer than 1,024 indices


def scatter_in_pieces(scatter, device: str, indices, updates):
    """``scatter(indices, updates)`` (it issues one scatter op and returns it) in pieces of at
    most :data:`PIECE_ROWS` rows when the variable's ``device`` is not a GPU; returns what runs
    after every piece (an op, the loop's counter, or None when eager). A size known when traced
    is cut by one ``tf.split`` per input, an unknown one in a ``tf.while_loop``."""
    rows = indices.shape[0]
    if on_gpu(device) or (rows is not None and rows <= PIECE_ROWS):
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


def adagrad_rows(var, accumulator, indices, grad, lr, epsilon):
    """Keras' Adagrad update of the rows ``indices`` (unique) of ``var`` on a CPU:
    ``accumulator[i] += grad**2``, then ``var[i] -= lr * grad / (sqrt(accumulator[i]) +
    epsilon)``, the floats of TF's fused CPU kernel (neither contracts a multiply-add). Returns
    the op that runs after both writes."""
    indices = after_values(indices, grad)
    acc_rows = tf.gather(accumulator, indices) + tf.square(grad)
    rows = tf.gather(var, indices) - lr * grad / (tf.sqrt(acc_rows) + epsilon)
    return tf.group(write_rows(accumulator, indices, acc_rows), write_rows(var, indices, rows))


def after_values(indices, values):
    """``indices`` once ``values`` (their gradient rows) exist. A gradient's values come from
    the step's forward, its indices straight from the lookup's ids: a gather at the indices
    alone (an optimizer reading its state) could run before the lookup and, for an id outside
    the table (``validate_ids=False``), fail first, naming itself instead of the lookup."""
    with tf.control_dependencies([values]):
        return tf.identity(indices)


def write_rows(var, indices, rows):
    """``var[indices] = rows`` (``indices`` unique): on a CPU TF's assignment kernel, a plain
    loop of row copies at any size (it has no parallel path to avoid); one kernel on a GPU."""
    return tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=indices, updates=rows)


def on_gpu(device: str | None) -> bool:
    """Whether a variable's ``device`` string names a GPU."""
    return "GPU" in (device or "").upper()
