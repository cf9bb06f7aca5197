"""Looking up arbitrary ids in one table (the table handles' ``embedding_lookup``).

Unlike a step of the block, each rank may look up a different number of ids (sampled
negatives, candidates), possibly none. One small allgather carries every rank's id count and
problem count (ids outside the table, unusable input) first, so every rank knows every
message size and all ranks fail together on bad input; then:

- data-parallel table: a local gather;
- row-, table- or column-sliced table: the one exchange of rows held elsewhere
  (``exchange.ask_owners``): every rank's ids go to every rank, each owner answers with its
  slice (a row slice with its rows, zeros elsewhere; a table or column slice with its
  columns), and the answers come back in one all-to-all, summed over row slices and joined in
  column order. Ranks that own no slice of the table receive the ids too: 8 bytes per id
  against the ``dim * 4`` bytes of its row (the cost is in ``exchange.py``).

Every collective runs on every rank (a rank that owns no slice sends an empty, tape-recorded
tensor), and the exchange is differentiable, so the table trains through the lookup.

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

from merlin_models_de.backends.horovod.exchange import ask_owners
from merlin_models_de.backends.lookup import named_gather, op_name, pooled_lookup
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
            if shards[0].kind is ShardingType.DATA_PARALLEL:
                var, first = backend.shard_variable(shards[0])
                return named_gather(var, ids + first, op_name(f"lookup_table_{table}"))
            return _from_owners(backend, shards, ids, counts, name)


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


def _from_owners(backend, shards, ids, counts, name):
    """Row, table or column slices: every rank's ids to every rank, each owner answers with
    its slice (``exchange.ask_owners``); a row slice's answers are summed, columns joined."""
    mine = next((s for s in shards if s.rank == backend.rank), None)
    columns = {s.rank: (s.col_start, s.cols) for s in shards}  # row slices: all (0, dim)

    def answer(all_ids, _):
        var, first = backend.shard_variable(mine)
        if mine.kind is ShardingType.ROW_WISE:  # a row slice is its own variable
            return pooled_lookup(
                var, all_ids, row_range=(mine.row_start, mine.rows), dtype=backend.dtype
            )
        return named_gather(
            var, all_ids + first, op_name(f"lookup_table_{mine.table}"), backend.dtype
        )

    anchor = backend.empty_send() if mine is None else None
    return ask_owners(ids, answer, columns, name, counts=counts, anchor=anchor)
