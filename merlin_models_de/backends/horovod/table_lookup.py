"""Looking up arbitrary ids in one table (the table handles' ``embedding_lookup``).

Unlike a step of the block, each rank may look up a different number of ids (sampled
negatives, candidates), possibly none. One small allgather carries every rank's id count and
problem count (ids outside the table, unusable input) first, so every rank knows every
message size and all ranks fail together on bad input; then:

- data-parallel table: a local gather;
- row-sliced table: every rank's ids go to every rank, each rank looks up its rows (zeros
  elsewhere) and sends each rank its partial rows, which are summed (``exchange.py``);
- table / column slices: the ids go to the slice owners, each owner answers with its
  columns, and the columns are joined in order.

Every collective runs on every rank (ranks with nothing to send send an empty, tape-recorded
tensor), and the exchanges are differentiable, so the table trains through the lookup.

Collective names: Horovod pairs graph-mode collectives across ranks by name, and one graph
may look a table up several times. Each lookup opens a name scope; inside a graph TF makes
its name unique (``.../mmde_lookup_user``, ``.../mmde_lookup_user_1``, ...) in call order,
which is the same on every rank, and the collectives are named after it. Eager collectives
complete one at a time, so a repeated name is harmless there.

Example:
    >>> vectors = lookup_ids(backend, "item_id", tf.constant([3, 7, 7]))  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.horovod.exchange import row_sliced_lookup
from merlin_models_de.backends.lookup import named_gather, op_name
from merlin_models_de.planner.types import ShardingType
from merlin_models_de.runtime import agree


def lookup_ids(backend, table: str, ids, problems=()):
    """``[len(ids), dim]`` rows of ``table`` for this rank's flat ``ids`` (collective).

    Args:
        backend: A built backend with ``plan``, ``shard_variable`` and ``empty_send``.
        table: The table name.
        ids: This rank's int ids, ``[n]`` (n may differ by rank, and be 0).
        problems: Messages about this rank's input found before the call (``ids`` is then
            a placeholder); they fail every rank, as bad ids do.
    """
    spec = backend.plan.table(table)
    with tf.name_scope(op_name(f"mmde_lookup_{table}")) as scope:
        name = backend.collective_name(op_name(scope.rstrip("/")))
        ids = tf.cast(tf.reshape(ids, [-1]), tf.int64)
        counts, checks = _header(backend, spec, ids, problems, name)
        with tf.control_dependencies(checks):
            # Horovod's graph collectives can hold a TF thread until every rank joins, so
            # every rank must start them in one order (header, ids, rows): data dependencies
            # (a zero no optimizer can fold away) enforce it where control edges get pruned
            ids = tf.identity(ids) + tf.cast(tf.minimum(tf.reduce_min(counts), 0), tf.int64)
            shards = backend.plan.shards_of(table)
            kind = shards[0].kind
            if kind is ShardingType.DATA_PARALLEL:
                var, first = backend.shard_variable(shards[0])
                return named_gather(var, ids + first, op_name(f"lookup_table_{table}"))
            if kind is ShardingType.ROW_WISE:
                return _row_sliced(backend, shards, ids, counts, name)
            return _sliced(backend, sorted(shards, key=lambda s: s.col_start), ids, counts, name)


def _header(backend, spec, ids, problems, name):
    """(ids per rank, checks): every rank's id count and problem count, asserted everywhere."""
    outside = tf.logical_or(ids < 0, ids >= spec.rows)
    bad = tf.reduce_sum(tf.cast(outside, tf.int64))
    received = agree.gather_header(
        [tf.size(ids, out_type=tf.int64), bad + len(problems)], f"{name}_header", backend.world_size
    )
    # a sentinel keeps argmax / gather defined when this rank has no ids
    first_bad = tf.gather(
        tf.concat([ids, [0]], 0), tf.argmax(tf.cast(tf.concat([outside, [True]], 0), tf.int32))
    )
    # after the allgather: a rank that fails before joining it would leave the others waiting
    with tf.control_dependencies([received]):
        checks = [tf.debugging.Assert(tf.constant(False), [message]) for message in problems[:1]]
    with tf.control_dependencies([received] + checks):
        checks.append(
            tf.debugging.Assert(
                tf.equal(bad, 0),
                [
                    f"An id is outside table '{spec.name}' (valid ids are 0..{spec.rows - 1}). "
                    "Received: id=",
                    first_bad,
                ],
                summarize=8,
            )
        )
    with tf.control_dependencies(checks):
        checks.append(
            agree.rank_problems_check(received[:, 1], backend.rank, f"ids for table '{spec.name}'")
        )
    return tf.cast(received[:, 0], tf.int32), checks  # counts read after the checks


def _row_sliced(backend, shards, ids, counts, name):
    """Every rank looks every rank's ids up in its rows; each rank sums its partial rows."""
    shard = next(s for s in shards if s.rank == backend.rank)
    var, _ = backend.shard_variable(shard)  # a row slice is its own variable
    return row_sliced_lookup(var, shard, ids, name, counts=counts, dtype=backend.dtype)


def _sliced(backend, shards, ids, counts, name):
    """Table / column slices: ids to every slice owner, columns back, joined in order."""
    n, rank = backend.world_size, backend.rank
    owners = {s.rank: s for s in shards}
    count = tf.size(ids, out_type=tf.int32)
    sent = tf.concat([ids for j in range(n) if j in owners], 0)
    splits = tf.stack([count if j in owners else tf.constant(0, tf.int32) for j in range(n)])
    asked, _ = comm.alltoall(sent, splits, name=f"{name}_ids")
    mine = owners.get(rank)
    if mine is not None:
        var, first = backend.shard_variable(mine)
        rows = named_gather(
            var, asked + first, op_name(f"lookup_table_{mine.table}"), backend.dtype
        )
        flat = tf.reshape(rows, [-1])
        back_splits = counts * mine.cols
    else:
        # a graph prunes a collective whose output nobody reads: the ranks that own no
        # slice must still run the ids exchange, or the owners wait for them forever
        zero = tf.cast(tf.minimum(tf.size(asked), 0), backend.dtype)
        flat = backend.empty_send() + zero
        back_splits = tf.zeros([n], tf.int32)
    received, _ = comm.alltoall(flat, back_splits, name=f"{name}_rows")
    sizes = [count * owners[j].cols if j in owners else tf.constant(0, tf.int32) for j in range(n)]
    pieces = tf.split(received, tf.stack(sizes), num=n)
    columns = {j: tf.reshape(pieces[j], [-1, owners[j].cols]) for j in owners}
    return tf.concat([columns[s.rank] for s in shards], axis=1)
