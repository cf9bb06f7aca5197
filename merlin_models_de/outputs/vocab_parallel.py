"""Vocab-parallel softmax cross-entropy and top-k over a row-sharded item table.

A next-item model scores its hidden states against the whole catalog (the item table used
as the tied output layer). Here the table is split by rows: rank r holds rows
``[row_offset_r, row_offset_r + R_r)`` of a catalog of ``num_rows`` items (any tiling of the
catalog by the ranks' ranges; a rank may hold 0 rows, which is table-wise placement on
another rank). No rank ever holds the full table or the full ``[batch, catalog]`` logits.

Math (rank r, global batch of ``B = sum_r B_r`` examples in rank order)::

    H, y     = allgather(hidden), allgather(targets)              [B, d], [B]
    z_r      = H @ W_r^T + b_r        (never whole: chunks of C rows)  [B, C] at a time
    m_r, s_r = running max and sum exp(z - m) over r's chunks     (online log-sum-exp)
    t_r      = z[i, y_i] where r owns y_i, else 0
    owner of example i receives (m, s, t) from every rank (one all-to-all) and forms
    M = max_r m_r,  lse = M + log sum_r s_r exp(m_r - M),  loss_i = lse_i - sum_r t_r

which is ``tf.nn.sparse_softmax_cross_entropy_with_logits(y, H @ W^T + b)`` of one process
on the global batch; each rank returns the losses of its own ``B_r`` examples.

Backward (``tf.custom_gradient``, logits recomputed chunk by chunk): with g_i the upstream
gradient of example i (allgathered with lse_i, so every rank knows every example's g and
lse) and ``D = g * (softmax(z) - onehot(y))`` on one chunk::

    d W_r[chunk] = D^T @ H,   d b_r[chunk] = sum_i D,   d H += D @ W_r[chunk]

and ``d H`` (each rank's partial sum over its rows) goes back to the example owners by an
all-to-all and is summed there (a reduce-scatter): each rank gets the exact gradient of its
own losses w.r.t. its own hidden states.

Gradient convention (the repository's, docs/design.md "Locality"): a sharded table is a
*local* variable. Its gradient above sums the contributions of *every* rank's examples,
each weighted by its owner's upstream gradient; Horovod's tape / optimizer then divides a
local gradient by N and never allreduces it. With each rank's loss the mean over its B/N
examples that gives ``(1/B) sum_i dL_i/dW``, one process's mean-loss gradient on the global
batch. Hidden states feed dense (replicated) weights, whose gradients Horovod averages; the
``d H`` above is already exact per rank, so the average is again one process's gradient.
Register the table (and bias) as local (``variables.is_local``; the block's sharded tables
already are). In one process there is no division and the gradient is the plain one.

Memory: forward and backward loop over full chunks in a ``tf.while_loop`` with
``parallel_iterations=1`` (one chunk alive at a time) and one static tail chunk; the largest
temporaries are ``[B, C]`` logits and ``[B, d]`` for H and d H; the gradient of the table is
``[R_r, d]`` like the table itself. Peak memory per rank is O(B * C + R_r * d), never
O(B * catalog). Communication per step: allgather of hidden [B, d] and targets, one
all-to-all of 3 floats per example forward; allgather of 2 floats per example and an
all-to-all of [B, d] backward.

Column-sliced tables (each rank holding some columns of every row) are not supported: the
logits would need a sum over the column slices of every chunk (an allreduce of [B, C] per
chunk). Every rank's table must have the hidden states' width; a narrower slice raises
on every rank. Place the item table row-sliced or whole on one rank.

Collectives are named ``{name}_<stage>`` (the same on every rank, unique per stage); use
a different ``name`` for each call within one training step. Bad input (targets outside
the catalog, rows of hidden and targets that differ, ranges that do not tile the catalog,
a table of the wrong width) is found after one header allgather and raises
``InvalidArgumentError`` on every rank together.

Example:
    >>> loss = sharded_softmax_cross_entropy(hidden, targets, table, row_offset=0,
    ...                                      num_rows=1000)  # doctest: +SKIP
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.runtime import agree

DEFAULT_CHUNK_ROWS = 4096
_SENTINEL_ID = tf.int64.max  # padding candidate id: sorts after every real id

# header fields, one row per rank
_BATCH, _TARGETS, _OFFSET, _ROWS, _COLS, _BIAS, _WIDTH = range(7)


# ---- input checks ------------------------------------------------------------------------------


def _static_checks(where, hidden, table, bias, chunk_rows):
    """Checks that depend only on dtypes and ranks (the same on every rank)."""
    if not hidden.dtype.is_floating or hidden.shape.rank != 2 or hidden.shape[-1] is None:
        raise ValueError(
            f"{where}: hidden must be a float [batch, dim] tensor with a known dim. "
            f"Received: dtype={hidden.dtype.name}, shape={hidden.shape}"
        )
    if table.dtype != hidden.dtype or table.shape.rank != 2:
        raise ValueError(
            f"{where}: table_rows must be a [rows, dim] tensor of hidden's dtype "
            f"{hidden.dtype.name}. Received: dtype={table.dtype.name}, "
            f"shape={table.shape}"
        )
    if bias is not None and (bias.dtype != hidden.dtype or bias.shape.rank != 1):
        raise ValueError(
            f"{where}: bias_rows must be a [rows] tensor of hidden's dtype "
            f"{hidden.dtype.name}. Received: dtype={bias.dtype.name}, "
            f"shape={bias.shape}"
        )
    if not isinstance(chunk_rows, numbers.Integral) or chunk_rows < 1:
        raise ValueError(f"{where}: chunk_rows must be a positive int. Received: {chunk_rows!r}")


def _targets_of(where, targets):
    targets = tf.convert_to_tensor(targets)
    if not targets.dtype.is_integer:
        raise ValueError(
            f"{where}: targets must be integer item ids. Received: dtype={targets.dtype.name}"
        )
    if targets.shape.rank == 2 and targets.shape[-1] == 1:  # Merlin feeds [batch, 1]
        targets = tf.squeeze(targets, -1)
    if targets.shape.rank != 1:
        raise ValueError(
            f"{where}: targets must have shape [batch] or [batch, 1]. "
            f"Received: shape={targets.shape}"
        )
    return tf.cast(targets, tf.int64)


def _exchange_header(where, name, hidden, n_targets, table, bias, row_offset, num_rows):
    """Allgathers every rank's shapes and row range; returns (header [N, 7], catalog, checks).

    ``checks`` are assertions that fail identically on every rank (they read the gathered
    header only); run them before any other collective. ``num_rows`` None: the catalog is
    the sum of the ranks' rows.
    """
    rows = tf.shape(table, out_type=tf.int64)
    fields = [
        tf.shape(hidden, out_type=tf.int64)[0],
        n_targets,
        row_offset,
        rows[0],
        rows[1],
        tf.size(bias, out_type=tf.int64) if bias is not None else -1,
        hidden.shape[-1],
    ]
    # after the hidden states exist: this step's earlier collectives (the block's) come first
    header = agree.gather_header(fields, f"{name}_header", comm.size(), after=hidden)
    catalog = (
        tf.reduce_sum(header[:, _ROWS]) if num_rows is None else tf.constant(num_rows, tf.int64)
    )
    first = agree.first_rank  # the first rank where a check fails

    checks = []
    bad = header[:, _BATCH] != header[:, _TARGETS]
    checks.append(
        tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)),
            [
                f"{where}: hidden and targets must have the same number of rows on every rank; "
                "rank, hidden rows, targets rows:",
                first(bad),
                tf.boolean_mask(header[:, 0], bad)[:1],
                tf.boolean_mask(header[:, 1], bad)[:1],
            ],
        )
    )
    bad = header[:, _COLS] != header[:, _WIDTH]
    checks.append(
        tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)),
            [
                f"{where}: every rank's table_rows must be as wide as the hidden states (column-sliced "
                "tables are not supported; slice the item table by rows); rank, table columns, "
                "hidden width:",
                first(bad),
                tf.boolean_mask(header[:, _COLS], bad)[:1],
                tf.boolean_mask(header[:, _WIDTH], bad)[:1],
            ],
        )
    )
    has_bias = header[:, _BIAS] >= 0
    bad = (has_bias & (header[:, _BIAS] != header[:, _ROWS])) | (has_bias != has_bias[0])
    checks.append(
        tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)),
            [
                f"{where}: bias_rows must be given on every rank or on none, with one value per row "
                "of table_rows; rank, bias length (-1: none), table rows:",
                first(bad),
                tf.boolean_mask(header[:, _BIAS], bad)[:1],
                tf.boolean_mask(header[:, _ROWS], bad)[:1],
            ],
        )
    )
    # the non-empty ranges, sorted by offset, must follow each other from 0 to the catalog size
    count = header[:, _ROWS]
    order = tf.argsort(tf.where(count > 0, header[:, _OFFSET], tf.int64.max), stable=True)
    starts, counts = tf.gather(header[:, _OFFSET], order), tf.gather(count, order)
    expected = tf.cumsum(counts, exclusive=True)
    tiles = (
        tf.reduce_all((counts == 0) | (starts == expected))
        & (tf.reduce_sum(count) == catalog)
        & tf.reduce_all(count >= 0)
    )
    checks.append(
        tf.debugging.Assert(
            tiles,
            [
                f"{where}: the ranks' row ranges must tile the catalog [0, num_rows) exactly; "
                "num_rows, then (row_offset, rows) of each rank:",
                catalog,
                tf.reshape(header[:, _OFFSET : _ROWS + 1], [-1]),
            ],
            summarize=64,
        )
    )
    return header, catalog, checks


def _check_targets(where, targets, header, catalog):
    """All ranks see the same global targets, so all raise the same message."""
    bad = (targets < 0) | (targets >= catalog)
    pos = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
    owner = tf.searchsorted(
        tf.cumsum(header[:, _BATCH]), pos[None], side="right", out_type=tf.int64
    )[0]
    example = pos - tf.reduce_sum(header[:, _BATCH][: tf.cast(owner, tf.int32)])
    return tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(bad)),
        [
            f"{where}: target ids must lie in the catalog [0, num_rows); num_rows, bad id, rank, "
            "example:",
            catalog,
            tf.gather(targets, pos),
            owner,
            example,
        ],
    )


# ---- chunked scans over the local rows ---------------------------------------------------------


def _chunk_plan(table, chunk_rows):
    """(full chunks, chunk size, tail rows): ints when the row count is static."""
    rows = table.shape[0]
    if rows is None:
        rows = tf.shape(table)[0]
    chunk = int(chunk_rows)
    return rows // chunk, chunk, rows - (rows // chunk) * chunk


def _has(count) -> bool:
    """Chunks to run? Always when the count is only known at run time."""
    return not isinstance(count, int) or count > 0


def _loop(n_full, chunk, body, state):
    """``body(index, lo, chunk, state) -> state`` over the full chunks: one
    ``tf.while_loop`` with ``parallel_iterations=1``, so one chunk is alive at a time."""
    out = tf.while_loop(
        lambda i, *s: i < n_full,
        lambda i, *s: (i + 1,) + tuple(body(i, i * chunk, chunk, s)),
        (tf.constant(0),) + tuple(state),
        parallel_iterations=1,
    )
    return tuple(out[1:])


def _scan(table, chunk_rows, body, state):
    """Runs ``body(index, lo, size, state) -> state`` over the local rows in chunks: the
    full chunks in a loop, then the tail (rows % chunk, static when the row count is)."""
    n_full, chunk, tail = _chunk_plan(table, chunk_rows)
    if _has(n_full):
        state = _loop(n_full, chunk, body, state)
    if _has(tail):
        state = body(n_full, n_full * chunk, tail, tuple(state))
    return tuple(state)


def _chunk_logits(hidden, table, bias, lo, size):
    """Logits of ``hidden`` against rows [lo, lo + size) of the local table: [B, size]."""
    rows = tf.slice(table, [lo, 0], [size, -1])  # static [size, d] when size is an int
    logits = tf.matmul(hidden, rows, transpose_b=True)
    if bias is not None:
        logits += tf.slice(bias, [lo], [size])
    return logits, rows


def _local_stats(hidden, targets, table, bias, row_offset, chunk_rows):
    """Per global example: max and sum exp(z - max) over the local rows, and the target's
    logit where this rank owns the target (else 0). Three [B] tensors."""
    dtype = hidden.dtype
    batch = tf.shape(hidden)[0]
    local = targets - tf.cast(row_offset, tf.int64)

    def body(_, lo, size, state):
        m, s, t = state
        logits, _ = _chunk_logits(hidden, table, bias, lo, size)
        new_m = tf.maximum(m, tf.reduce_max(logits, axis=1))
        shift = tf.where(tf.math.is_inf(new_m), tf.zeros_like(new_m), new_m)  # no inf - inf
        s = s * tf.exp(m - shift) + tf.reduce_sum(tf.exp(logits - shift[:, None]), axis=1)
        hit = tf.one_hot(local - tf.cast(lo, tf.int64), size, dtype=dtype)  # 0 off-chunk
        return new_m, s, t + tf.reduce_sum(logits * hit, axis=1)

    init = (
        tf.fill([batch], tf.constant(-float("inf"), dtype)),
        tf.zeros([batch], dtype),
        tf.zeros([batch], dtype),
    )
    return _scan(table, chunk_rows, body, init)


def _local_grads(hidden, targets, table, bias, row_offset, lse, scale, chunk_rows):
    """(d table, d bias or None, partial d hidden [B, d]) from this rank's rows, chunked."""
    dtype = hidden.dtype
    local = targets - tf.cast(row_offset, tf.int64)
    width = table.shape[1]

    def body(index, lo, size, state):
        d_rows, d_bias, d_hidden = state
        logits, rows = _chunk_logits(hidden, table, bias, lo, size)
        hit = tf.one_hot(local - tf.cast(lo, tf.int64), size, dtype=dtype)
        delta = (tf.exp(logits - lse[:, None]) - hit) * scale[:, None]
        d_hidden += tf.matmul(delta, rows)
        grad_rows = tf.matmul(delta, hidden, transpose_a=True)
        grad_bias = tf.reduce_sum(delta, axis=0)
        if isinstance(d_rows, tf.TensorArray):  # a full chunk, inside the loop
            return d_rows.write(index, grad_rows), d_bias.write(index, grad_bias), d_hidden
        return grad_rows, grad_bias, d_hidden  # the tail, after the loop

    d_hidden = tf.zeros_like(hidden)
    n_full, chunk, tail = _chunk_plan(table, chunk_rows)
    parts_rows, parts_bias = [], []
    if _has(n_full):
        arrays = (
            tf.TensorArray(dtype, size=n_full, element_shape=[chunk, width]),
            tf.TensorArray(dtype, size=n_full, element_shape=[chunk]),
        )
        rows_array, bias_array, d_hidden = _loop(n_full, chunk, body, arrays + (d_hidden,))
        parts_rows, parts_bias = [rows_array.concat()], [bias_array.concat()]
    if _has(tail):
        tail_rows, tail_bias, d_hidden = body(n_full, n_full * chunk, tail, (None, None, d_hidden))
        parts_rows.append(tail_rows)
        parts_bias.append(tail_bias)
    if not parts_rows:  # this rank holds no rows
        return tf.zeros_like(table), (tf.zeros_like(bias) if bias is not None else None), d_hidden
    d_table = tf.concat(parts_rows, 0) if len(parts_rows) > 1 else parts_rows[0]
    d_bias = tf.concat(parts_bias, 0) if len(parts_bias) > 1 else parts_bias[0]
    return d_table, (d_bias if bias is not None else None), d_hidden


def _gather_inputs(where, name, hidden, targets, table, bias, row_offset, num_rows):
    """Header exchange and checks, then the global batch. Returns (H, y, every rank's
    batch size, catalog size, header)."""
    n_targets = tf.shape(hidden)[0] if targets is None else tf.shape(targets)[0]
    header, catalog, checks = _exchange_header(
        where, name, hidden, n_targets, table, bias, row_offset, num_rows
    )
    with tf.control_dependencies(checks):  # nothing else moves before every rank checked
        # one order on every rank: header, hidden, targets (see ``comm.after``)
        global_hidden = comm.allgather(comm.after(hidden, header), f"{name}_hidden")
        global_targets = (
            comm.allgather(comm.after(targets, global_hidden), f"{name}_targets")
            if targets is not None
            else None
        )
    return global_hidden, global_targets, tf.cast(header[:, _BATCH], tf.int32), catalog, header


# ---- the loss ----------------------------------------------------------------------------------


def sharded_softmax_cross_entropy(
    hidden,
    targets,
    table_rows,
    row_offset,
    num_rows,
    bias_rows=None,
    chunk_rows=DEFAULT_CHUNK_ROWS,
    name="mmde_vocab_ce",
):
    """Per-example softmax cross-entropy of this rank's examples over a row-sharded catalog.

    Equal to ``tf.nn.sparse_softmax_cross_entropy_with_logits(targets_global,
    hidden_global @ W^T + b)`` of one process holding the whole table ``W`` (and bias
    ``b``), restricted to this rank's examples; gradients follow the repository's
    convention (module docstring). Collective: every rank calls it in the same order.

    Args:
        hidden: ``[B_local, d]`` this rank's hidden states (float).
        targets: ``[B_local]`` (or ``[B_local, 1]``) global item ids in ``[0, num_rows)``.
        table_rows: ``[R_local, d]`` rows ``[row_offset, row_offset + R_local)`` of the item
            table (a variable or tensor; ``R_local`` may be 0).
        row_offset: this rank's first row (int or scalar tensor).
        num_rows: the catalog size (the same on every rank).
        bias_rows: optional ``[R_local]`` per-item bias, sharded like the table.
        chunk_rows: rows scored at a time; peak memory is about ``B_global * chunk_rows``.
        name: prefix of the collectives' names; distinct for each call in one step.

    Returns:
        ``[B_local]`` losses (the dtype of ``hidden``).
    """
    where = f"sharded_softmax_cross_entropy '{name}'"
    hidden = tf.convert_to_tensor(hidden)
    table = tf.convert_to_tensor(table_rows)  # reads a variable; the tape links it back
    bias = tf.convert_to_tensor(bias_rows) if bias_rows is not None else None
    _static_checks(where, hidden, table, bias, chunk_rows)
    if not isinstance(num_rows, numbers.Integral) or num_rows < 1:
        raise ValueError(f"{where}: num_rows must be a positive int. Received: {num_rows!r}")
    targets = _targets_of(where, targets)

    def forward(hidden, table, *maybe_bias):
        bias = maybe_bias[0] if maybe_bias else None
        h, y, sizes, catalog, header = _gather_inputs(
            where, name, hidden, targets, table, bias, row_offset, num_rows
        )
        with tf.control_dependencies([_check_targets(where, y, header, catalog)]):
            m, s, t = _local_stats(h, y, table, bias, row_offset, chunk_rows)
        # a rank with 0 rows computes m, s, t from shapes only: tie them to the targets
        stats = tf.reshape(
            comm.alltoall(comm.after(tf.stack([m, s, t], axis=1), y), sizes, f"{name}_stats")[0],
            [comm.size(), -1, 3],
        )
        top = tf.reduce_max(stats[..., 0], axis=0)
        shift = tf.where(tf.math.is_inf(top), tf.zeros_like(top), top)
        lse = shift + tf.math.log(
            tf.reduce_sum(stats[..., 1] * tf.exp(stats[..., 0] - shift), axis=0)
        )
        loss = lse - tf.reduce_sum(stats[..., 2], axis=0)

        def backward(upstream):
            # every rank needs every example's upstream gradient and log-sum-exp
            both = comm.allgather(tf.stack([upstream, lse], axis=1), f"{name}_grad_stats")
            d_table, d_bias, d_h = _local_grads(
                h, y, table, bias, row_offset, both[:, 1], both[:, 0], chunk_rows
            )
            # reduce-scatter: each owner sums every rank's partial d hidden of its examples
            # (a rank with 0 rows never reads ``both``: without the tie TF prunes its gather)
            d_hidden = tf.reduce_sum(
                tf.reshape(
                    comm.alltoall(comm.after(d_h, both), sizes, f"{name}_grad_hidden")[0],
                    [comm.size(), -1, h.shape[1]],
                ),
                axis=0,
            )
            return (d_hidden, d_table) + ((d_bias,) if bias is not None else ())

        return loss, backward

    args = (hidden, table) + ((bias,) if bias is not None else ())
    return tf.custom_gradient(forward)(*args)


# ---- top-k -------------------------------------------------------------------------------------


def _merge_top_k(scores, ids, k):
    """Top ``k`` of candidate (scores, ids) per row; equal scores: the lower id first, as
    ``tf.math.top_k`` over the full logits orders them (lower index first)."""
    order = tf.argsort(ids, axis=1, stable=True)
    scores = tf.gather(scores, order, batch_dims=1)
    ids = tf.gather(ids, order, batch_dims=1)
    values, positions = tf.math.top_k(scores, k)
    return values, tf.gather(ids, positions, batch_dims=1)


def sharded_top_k(
    hidden,
    k,
    table_rows,
    row_offset,
    bias_rows=None,
    chunk_rows=DEFAULT_CHUNK_ROWS,
    num_rows=None,
    name="mmde_vocab_top_k",
):
    """Top-k items of each of this rank's hidden states over a row-sharded catalog.

    Every rank scores the global batch against its rows in chunks, keeping a running top-k
    (``[B_global, k]``); each example's ``N * k`` candidates go to its owner (all-to-all),
    which merges them. Equal to ``tf.math.top_k(hidden_global @ W^T + b, k)`` of one
    process on this rank's examples; equal scores rank the lower item id first (as
    ``tf.math.top_k`` does). Not differentiable. Collective.

    Args:
        hidden: ``[B_local, d]`` hidden states.
        k: how many items (an int, at most the catalog size).
        table_rows, row_offset, bias_rows, chunk_rows: as in
            :func:`sharded_softmax_cross_entropy`.
        num_rows: the catalog size, checked against the ranks' row ranges; None: their sum.
        name: prefix of the collectives' names.

    Returns:
        ``(scores [B_local, k], ids [B_local, k] int64 global item ids)``.
    """
    where = f"sharded_top_k '{name}'"
    hidden = tf.stop_gradient(tf.convert_to_tensor(hidden))
    table = tf.stop_gradient(tf.convert_to_tensor(table_rows))
    bias = tf.stop_gradient(tf.convert_to_tensor(bias_rows)) if bias_rows is not None else None
    _static_checks(where, hidden, table, bias, chunk_rows)
    if not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"{where}: k must be a positive int. Received: {k!r}")
    h, _, sizes, catalog, _ = _gather_inputs(
        where, name, hidden, None, table, bias, row_offset, num_rows
    )
    with tf.control_dependencies(
        [
            tf.debugging.Assert(
                catalog >= k,
                [f"{where}: k must be at most the catalog size; k, catalog size:", k, catalog],
            )
        ]
    ):
        batch = tf.shape(h)[0]
    offset = tf.cast(row_offset, tf.int64)

    def body(_, lo, size, state):
        scores, ids = state
        logits, _ = _chunk_logits(h, table, bias, lo, size)
        values, positions = tf.math.top_k(
            logits, min(k, size) if isinstance(size, int) else tf.minimum(k, size)
        )
        chunk_ids = tf.cast(positions, tf.int64) + offset + tf.cast(lo, tf.int64)
        return _merge_top_k(tf.concat([scores, values], 1), tf.concat([ids, chunk_ids], 1), k)

    init = (
        tf.fill([batch, k], tf.constant(-float("inf"), h.dtype)),
        tf.fill([batch, k], tf.constant(_SENTINEL_ID, tf.int64)),
    )
    scores, ids = _scan(table, chunk_rows, body, init)
    n = comm.size()

    def per_owner(x, stage):  # [B_global, k] -> this rank's [B_local, N * k]
        x = tf.reshape(comm.alltoall(x, sizes, f"{name}_{stage}")[0], [n, -1, k])
        return tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, n * k])

    scores = per_owner(scores, "scores")
    return _merge_top_k(scores, per_owner(comm.after(ids, scores), "ids"), k)


# ---- full logits (predict) ---------------------------------------------------------------------


def sharded_logits(
    hidden, table_rows, row_offset, num_rows=None, bias_rows=None, name="mmde_vocab_logits"
):
    """Full logits ``[B_local, catalog]`` of this rank's hidden states over a row-sharded
    catalog: what ``predict`` returns, equal to ``hidden @ W^T (+ b)`` of one process
    (``bias_rows``: this rank's ``[R_local]`` bias, as in :func:`sharded_softmax_cross_entropy`).

    Every rank scores the global batch against its own rows; each example's scores go to
    its owner (one all-to-all of ``[B_global, R_max]``), which puts the columns in item order.
    Memory per rank: ``O(B_global * R_r + B_local * catalog)``, the logits the caller asked
    for (never the global batch's). Not differentiable. Collective.
    """
    where = f"sharded_logits '{name}'"
    hidden = tf.stop_gradient(tf.convert_to_tensor(hidden))
    table = tf.stop_gradient(tf.convert_to_tensor(table_rows))
    bias = tf.stop_gradient(tf.convert_to_tensor(bias_rows)) if bias_rows is not None else None
    _static_checks(where, hidden, table, bias, DEFAULT_CHUNK_ROWS)
    h, _, sizes, catalog, header = _gather_inputs(
        where, name, hidden, None, table, bias, row_offset, num_rows
    )
    offsets, rows = header[:, _OFFSET], header[:, _ROWS]
    width = tf.reduce_max(rows)
    local = tf.matmul(h, table, transpose_b=True)  # [B_global, R_r]
    if bias is not None:
        local += bias
    local = tf.pad(local, [[0, 0], [0, width - tf.shape(local, out_type=tf.int64)[1]]])
    received = comm.alltoall(comm.after(local, h), sizes, f"{name}_scores")[0]
    n = tf.shape(header, out_type=tf.int64)[0]
    per_rank = tf.reshape(received, tf.stack([n, -1, width]))  # [N, B_local, R_max]
    flat = tf.reshape(tf.transpose(per_rank, [1, 0, 2]), tf.stack([tf.shape(per_rank)[1], -1]))
    items = tf.range(catalog, dtype=tf.int64)[:, None]
    owner = tf.argmax(tf.cast((items >= offsets) & (items < offsets + rows), tf.int32), axis=1)
    column = owner * width + items[:, 0] - tf.gather(offsets, owner)
    return tf.gather(flat, column, axis=1)


__all__ = ["DEFAULT_CHUNK_ROWS", "sharded_logits", "sharded_softmax_cross_entropy", "sharded_top_k"]
