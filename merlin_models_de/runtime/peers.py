"""Which rank stopped answering: the one home where a collective that failed because a peer
went silent becomes an error naming that peer.

When a rank stops (SIGSTOP, Ctrl-Z, a debugger, a swap storm) or dies mid-step, the others
wait in their next collective until Gloo's timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``, 30 s by
default) or the closed connection ends Horovod's background loop. Every later op then fails
with Horovod's "Horovod has been shut down ... an exception on one of the ranks", which
names nobody, and horovodrun names the first process that *exited*: the healthy rank that
raised, not the silent one.

The healthy rank knows its own rank and the world; it learns each peer's host, PID namespace,
pid and start time from the host-side exchanges every rank already makes
(:func:`merlin_models_de.runtime.agree.on_every_rank`, before each fit / evaluate / predict),
so naming the silent rank costs no collective and nothing per step. On failure it reads the
state of the peers on its own host (``/proc``: stopped, exited) and names the silent one(s);
peers on other hosts it cannot see are named as the ranks it waited for.

Example:
    >>> with naming_silent_ranks():  # doctest: +SKIP
    ...     model.fit(x, y)
"""

from __future__ import annotations

import contextlib
import os
import re
import socket

from merlin_models_de import comm
from merlin_models_de.runtime.processes import pid_namespace, process_stat

# Horovod's text for every op after its background loop ended (a transport error or timeout)
SHUT_DOWN = "Horovod has been shut down"

# /proc/<pid>/stat states of a process that does not answer, and what each means
_SILENT_STATES = {
    "T": "is stopped (SIGSTOP, or SIGTSTP: Ctrl-Z)",
    "t": "is held by a debugger",
    "Z": "has exited",
    "X": "has exited",
}  # "D" (in the kernel, disk I/O) is not one: a healthy rank passes through it

# what this process last learnt of every rank, in rank order (see remember())
_world: list = []


def identity() -> tuple:
    """This process as its peers can find it: ``(host, PID namespace, pid, start time)``."""
    pid = os.getpid()
    return socket.gethostname(), pid_namespace(), pid, process_stat(pid)[1]


def remember(identities: list) -> None:
    """Keeps every rank's :func:`identity` (rank order), as the last host exchange gave them."""
    _world[:] = list(identities)


def _state_of(peer: tuple) -> str | None:
    """What peer ``(host, namespace, pid, start)`` is doing, seen from here: a phrase for a
    silent process, ``""`` for one that runs, None where this process cannot see it."""
    host, namespace, pid, start = peer
    here = identity()
    if (host, namespace) != here[:2] or namespace is None:
        return None
    state, started = process_stat(pid)
    if state is None or (start is not None and started not in (None, start)):
        return "has exited"  # gone, or its pid now belongs to another process
    return _SILENT_STATES.get(state, "")


def silent_ranks(rank: int, size: int, world: list) -> list[tuple[int, str, str | None]]:
    """The ranks that rank ``rank`` of ``size`` most likely waited for: ``[(rank, where, what
    it is doing)]``. Peers on this host seen stopped or gone, else the peers it cannot see,
    else (every peer here runs) all of them. ``world``: :func:`identity` of every rank."""
    others = [r for r in range(size) if r != rank]
    if len(world) != size:  # no exchange yet (or another world): who, but not where
        return [(r, "", None) for r in others]
    states = {r: _state_of(world[r]) for r in others}
    where = {r: f" (pid {world[r][2]} on host {world[r][0]})" for r in others}
    for chosen in ([r for r in others if states[r]], [r for r in others if states[r] is None]):
        if chosen:
            return [(r, where[r], states[r]) for r in chosen]
    return [(r, where[r], "still runs (it may have raised: see its output)") for r in others]


def silent_rank_message(error_text: str, rank: int, size: int, world: list) -> str | None:
    """The message for a collective that failed with ``error_text`` on rank ``rank`` because a
    peer went silent (Horovod shut down), naming that peer; None for any other failure."""
    if size < 2 or SHUT_DOWN not in error_text:
        return None
    node = re.findall(r"Node: '([^']+)'", error_text)
    waited = f" in the collective {node[-1].rsplit('/', 1)[-1]!r}" if node else ""
    silent = silent_ranks(rank, size, world)
    if len(silent) == 1:
        other, where, what = silent[0]
        who = f"Rank {other}{where} stopped answering" + (f": its process {what}" if what else "")
    else:
        who = "One of the ranks " + ", ".join(
            f"{r}{where}" + (f" (it {what})" if what else "") for r, where, what in silent
        )
        who += " stopped answering"
    return (
        f"{who}. Rank {rank} (this one) waited for it{waited} until Horovod's transport gave "
        f"up (Gloo waits HOROVOD_GLOO_TIMEOUT_SECONDS, 30 s by default; a closed connection "
        f"ends it at once) and Horovod shut down; this rank is not the cause. Horovod's "
        f"error: {error_text}"
    )


@contextlib.contextmanager
def naming_silent_ranks():
    """Re-raises a collective's failure caused by a silent peer (see the module's text) as
    the same TensorFlow error type, its message naming the rank that stopped answering."""
    rank, size = comm.rank(), comm.size()  # Horovod cannot say them once it shut down
    try:
        yield
    except comm.tf.errors.OpError as error:
        message = silent_rank_message(error.message or "", rank, size, _world)
        if message is None:
            raise
        raise type(error)(error.node_def, error.op, message) from error


__all__ = ["identity", "naming_silent_ranks", "remember", "silent_rank_message", "silent_ranks"]
