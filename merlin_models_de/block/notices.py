"""One-line notices for the user, each printed once per process."""

from __future__ import annotations

import os
import sys

from merlin_models_de import comm

_SHOWN: set[str] = set()


def one_rank_notice(world_size: int) -> str | None:
    """Says once, on stderr, that the block runs without splitting its tables: in a plain
    process (not started by horovodrun) or under horovodrun with one rank. Silent inside
    :class:`~merlin_models_de.comm.single_process` (a model copied for export) and on more
    ranks. Returns the line printed, else None."""
    if world_size != 1 or comm.overridden() or "one_rank" in _SHOWN:
        return None
    _SHOWN.add("one_rank")
    where = (
        "under horovodrun with one rank"
        if "HOROVOD_RANK" in os.environ
        else "in one process (not started by horovodrun)"
    )
    line = (
        f"merlin_models_de: DistributedEmbeddings runs {where}: every table is whole "
        "here, as with mm.Embeddings; launch with `horovodrun -np N` to split them."
    )
    print(line, file=sys.stderr, flush=True)
    return line
