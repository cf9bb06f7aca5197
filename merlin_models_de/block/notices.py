"""One-line notices for the user, each printed once per process."""

from __future__ import annotations

import sys

from merlin_models_de import comm
from merlin_models_de.launchers import launcher

_SHOWN: set[str] = set()


def one_rank_notice(world_size: int) -> str | None:
    """Says once, on stderr, that the block runs without splitting its tables: in a plain
    process (not started by a launcher) or a launch of one rank. Silent inside
    :class:`~merlin_models_de.comm.single_process` (a model copied for export) and on more
    ranks. Returns the line printed, else None."""
    if world_size != 1 or comm.overridden() or "one_rank" in _SHOWN:
        return None
    _SHOWN.add("one_rank")
    started_by = launcher()
    where = (
        f"under {started_by} with one rank"
        if started_by
        else "in one process (not started by a launcher)"
    )
    line = (
        f"merlin_models_de: DistributedEmbeddings runs {where}: every table is whole "
        "here, as with mm.Embeddings; start N ranks (`horovodrun -np N`, `mpirun -np N`, "
        "`srun -n N`) to split them."
    )
    print(line, file=sys.stderr, flush=True)
    return line
