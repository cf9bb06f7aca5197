"""What a command's run report records of each rank (its peak resident memory, its CPU time,
its host's stolen time, the embedding bytes it holds), and rank 0 writing the report."""

from __future__ import annotations

import json
import os
import resource

from merlin_models_de import comm


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def huge_page_bytes(path: str = "/proc/self/smaps_rollup") -> int | None:
    """This process's memory now on transparent huge pages (``AnonHugePages``), or None where
    the kernel does not say (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024  # KiB
    except OSError:
        return None
    return None


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds this process used so far, every thread counted."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def host_cpu_ticks(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(stolen, all) CPU ticks of this host so far, every core: ``steal`` is the time the
    hypervisor ran someone else while this VM's cores were ready to run. None where the
    kernel does not say (not Linux).

    Runs on a shared VM can lose a third of their cores to steal for seconds at a time;
    the bench uses the share to tell such runs apart from slow ones.

    Example:
        >>> import os, tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix="stat", delete=False) as f:
        ...     _ = f.write("cpu  10 0 5 80 1 0 0 4 0 0\\ncpu0 5 0 2 40 0 0 0 2 0 0\\n")
        >>> host_cpu_ticks(f.name)
        (4, 100)
        >>> os.remove(f.name)
    """
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    ticks = [int(v) for v in fields[1:9]]
    return ticks[7], sum(ticks)


def embedding_bytes(block) -> int:
    """Bytes of the embedding tables this rank holds (shards and replicated tables).

    Tables are the 2-D weights: a backend's scalar helpers (the Horovod backend's exchange
    anchor) hold no embeddings.
    """
    return sum(v.shape.num_elements() * v.dtype.size for v in block.weights if v.shape.rank == 2)


def write_report(path: str | None, report: dict) -> None:
    """Rank 0 writes ``report`` as JSON to ``path`` (its folder made first) and says where;
    nothing when ``path`` is None."""
    if path and comm.rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"Report: {path}")
