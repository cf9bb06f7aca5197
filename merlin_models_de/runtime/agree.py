"""Every rank fails together: the one home of that rule, in the graph and on the host.

A rank that raises alone leaves the others waiting forever in their next collective. So a
rank never raises before every rank has learnt every rank's outcome:

- in the graph, each rank puts a few int64 numbers (sizes, problem counts, row ranges) in a
  *header* that one allgather delivers to every rank (:func:`gather_header`); the checks then
  read the gathered header only, so they fail identically everywhere
  (:func:`rank_problems_check`, :func:`first_rank`);
- on the host, each rank runs its part and the outcomes are exchanged before anyone raises
  (:func:`on_every_rank`): the failing rank re-raises its own exception, the others raise one
  that names it.

Example:
    >>> result, shared = on_every_rank("writing shards", write, error_type=OSError)  # doctest: +SKIP
"""

from __future__ import annotations

import re

from merlin_models_de import comm
from merlin_models_de.runtime import peers

# ---- in the graph ------------------------------------------------------------------------------


def gather_header(fields, name: str, world_size: int, after=None):
    """Every rank's ``fields`` (int64 scalars) as an ``[N, len(fields)]`` matrix, row r from
    rank r: one allgather named ``name`` (none on one rank). ``after``: a tensor the header
    must wait for (so the step's earlier collectives start first, in one order everywhere)."""
    tf = comm.tf
    mine = tf.stack([tf.cast(f, tf.int64) for f in fields])
    if after is not None:
        mine = comm.after(mine, after)
    if world_size == 1:
        return mine[None]
    return tf.reshape(comm.allgather(mine[None], name=name), [-1, len(fields)])


def first_rank(bad):
    """``[1]`` (the first rank where ``bad [N]`` holds) or ``[0]``-shaped: for messages."""
    tf = comm.tf
    ranks = tf.range(tf.shape(bad, out_type=tf.int64)[0])
    return tf.boolean_mask(ranks, bad)[:1]


def rank_problems_check(problems, rank: int, what: str):
    """The assertion every rank runs on the gathered problem counts ``[N]``: any count above
    zero fails this rank too, naming the rank(s) with the problem (whose own assertion names
    the feature and the value). Run it after this rank's own assertions."""
    tf = comm.tf
    return tf.debugging.Assert(
        tf.reduce_all(tf.equal(problems, 0)),
        [
            f"Invalid {what} on another rank (this is rank {rank}); see that rank's error. "
            "Problems per rank:",
            problems,
        ],
        summarize=64,
    )


# ---- on the host -------------------------------------------------------------------------------


def on_every_rank(name: str, work, share=None, error_type=RuntimeError, wrap_own=False):
    """Runs ``work()`` here, then raises on every rank if it failed on any rank.

    Args:
        name: what this stage does (in error messages and the collective's name).
        work: this rank's part.
        share: maps ``work()``'s result to a small picklable value sent to every rank.
        error_type: what the ranks that did not fail raise (with the failing rank's
            ``Type: message``).
        wrap_own: the failing rank raises ``error_type`` too (from its own exception), so
            every rank's message is the same; else it re-raises its own exception.

    Returns:
        ``(result of work(), [every rank's shared value, in rank order])``.
    """
    try:
        result, error = work(), None
    except Exception as exc:  # noqa: BLE001  (re-raised below, on every rank)
        result, error = None, exc
    mine = (
        None if error is None else f"{type(error).__name__}: {error}",
        share(result) if share is not None and error is None else None,
        peers.identity(),  # so that a rank gone silent later can be named (peers.py)
    )
    outcomes = comm.allgather_object(mine, name="mmde_" + re.sub(r"\W+", "_", name))
    peers.remember([where for _, _, where in outcomes])
    if error is not None and not wrap_own:
        raise error
    for rank, (message, _, _) in enumerate(outcomes):
        if message is not None:
            raise error_type(
                f"{name[:1].upper()}{name[1:]} failed on rank {rank}: {message}"
            ) from error
    return result, [shared for _, shared, _ in outcomes]


def on_rank_zero(name: str, work, error_type=RuntimeError, wrap_own=True):
    """Runs ``work()`` on rank 0 only; every rank returns or raises together (by default
    every rank ``error_type`` naming rank 0 and its error)."""
    result, _ = on_every_rank(
        name, work if comm.rank() == 0 else (lambda: None), error_type=error_type, wrap_own=wrap_own
    )
    return result
