"""What the training commands share for their options (no TensorFlow, no Horovod here).

A command builds its parser with :class:`OneLineParser`, checks the parsed options with its
own ``check_options`` (the same answer on every rank) and ``check_host`` (files, installed
packages: may differ by host), and calls :func:`checked_arguments`, which reports the first
problem as one line and gives None, so every rank exits with status 2 before TensorFlow loads.

Example:
    >>> ap = OneLineParser(prog="demo")
    >>> _ = ap.add_argument("--mlp", type=ints, default=[128])
    >>> ap.parse_args(["--mlp", "64,32"]).mlp
    [64, 32]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time

from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.hotness import parse_hotness
from merlin_models_de.apps.common.huge_pages import relaunch_on_huge_pages
from merlin_models_de.apps.common.schemas import SCHEMA_FILES, schema_file_in
from merlin_models_de.backends.memory import available_bytes
from merlin_models_de.backends.options import ExchangeOptions
from merlin_models_de.launchers import launch_env
from merlin_models_de.planner.options import PlacementOptions, field_names

EMBEDDINGS = ("distributed", "merlin")  # merlin: mm.Embeddings (data parallel), for baselines
# the DLRM command's speed bound (common/optimizers.optimizer_for), not a valid training
LOCAL_TABLES = "local-tables"
INPUTS = ("tf.data", "loader")  # how a command feeds fit: loader_dataset or Merlin's Loader
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def ints(text: str) -> list[int]:
    """``"128,64"`` -> ``[128, 64]``; anything else (empty, non-positive) is an option error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like '128,64', got {text!r}")
    return values


def parse_bytes(text: str, flag: str) -> int:
    """The value of the option ``flag``, an amount of memory: ``'80GB' -> 80_000_000_000``;
    ``'16GiB' -> 17179869184``. Must come to at least 1 byte.

    Example:
        >>> parse_bytes("1.5KiB", "--device-memory")
        1536
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{flag} must look like '80GB' or '16GiB'. Received: {flag}={text!r}")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 1:
        raise ValueError(f"{flag} must be > 0. Received: {flag}={text!r}")
    return value


def write_json(path: str | None, payload) -> None:
    """Writes ``payload`` as indented JSON to ``path`` (nothing when ``path`` is None)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)


def world() -> tuple[int, int, int]:
    """(size, rank, local_size) from horovodrun's environment, without initializing Horovod."""
    return launch_env()


# How long a rank that stays silent about a problem waits before it exits (below)
RANK_0_GRACE_SECONDS = 5.0


def let_rank_0_speak() -> None:
    """A rank other than 0 that stops on a problem rank 0 reports waits a moment first:
    horovodrun ends the whole job at the first rank's exit, which can cut rank 0 off before
    its line is out (seen on a loaded machine: no error line at all)."""
    size, rank, _ = world()
    if size > 1 and rank != 0:
        time.sleep(RANK_0_GRACE_SECONDS)


class OneLineParser(argparse.ArgumentParser):
    """Bad options: one line on stderr (rank 0 only under horovodrun), exit status 2."""

    def error(self, message):
        if world()[1] == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        let_rank_0_speak()
        sys.exit(2)


def placement_of(args) -> PlacementOptions:
    """The placement a command's options give: ``--strategy``, the thresholds, and the step
    ``work_balanced`` places for, from the command's own ``--batch-size`` and ``--optimizer``
    (and ``--hotness``, ``--link``, ``--max-rank-elements`` where a command has them; the
    DLRM and next-item commands have none of these three). A field whose option the command
    does not have keeps its default, which is the plan command's default too, so
    ``mmde-plan`` given a DLRM run's options prints the placement that run's block makes.
    The commands' ``--optimizer`` names (``common/optimizers.OPTIMIZERS``) are the planner's
    own. Raises ValueError naming a bad value (the DLRM command's ``check_options`` reports
    it before TensorFlow loads).

    Example:
        >>> from types import SimpleNamespace
        >>> p = placement_of(SimpleNamespace(strategy="work_balanced", batch_size=64, hotness="2"))
        >>> p.batch_size, p.hotness, p.optimizer, p.link
        (64, 2.0, 'adagrad', 'gloo-loopback')
    """
    given = {
        name: getattr(args, name) for name in field_names(PlacementOptions) if hasattr(args, name)
    }
    if isinstance(given.get("hotness"), str):  # the option's text, as the plan command reads it
        given["hotness"] = parse_hotness(given["hotness"])
    return PlacementOptions(**given)


def exchange_of(args) -> ExchangeOptions:
    """How a command's options say the exchange runs; an option the command does not have
    (the next-item command has no ``--exchange-dtype``) keeps its default. Raises ValueError
    naming a bad value."""
    names = field_names(ExchangeOptions)
    return ExchangeOptions(**{name: getattr(args, name) for name in names if hasattr(args, name)})


def add_run_options(group, checkpoint_help: str) -> None:
    """The output options the DLRM and next-item commands share: checkpoints, the report,
    the rank's threads, ``--quiet`` and ``--elastic``."""
    group.add_argument("--checkpoint-dir", default=None, help=checkpoint_help)
    group.add_argument("--checkpoint-every", type=int, default=None, help="also every N steps")
    group.add_argument(
        "--checkpoint-keep",
        type=int,
        default=None,
        help="keep the N newest checkpoints (default: 3; 0 keeps every one)",
    )
    group.add_argument("--report", default=None, help="JSON run report path")
    group.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="TF threads per rank (default: cores / ranks on this host)",
    )
    group.add_argument(
        "--no-huge-pages",
        dest="huge_pages",
        action="store_false",
        help="keep glibc's 4 KB pages (default: the command starts itself again with "
        "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 where the kernel and glibc allow it; "
        "docs/training.md)",
    )
    group.add_argument(
        "--quiet",
        action="store_true",
        help="accepted for older scripts: Keras' own epoch lines are off, "
        "the command prints one line per epoch",
    )
    group.add_argument(
        "--elastic",
        action="store_true",
        help="Horovod elastic (horovodrun --min-np/--max-np/--host-discovery-"
        "script): commit every --checkpoint-every steps, go on after a "
        "lost host (docs/multihost.md)",
    )


def elastic_problem(args) -> str | None:
    """``--elastic`` without the commits it needs, as one line, or None."""
    if args.elastic and not (args.checkpoint_dir and args.checkpoint_every):
        return (
            "--elastic needs --checkpoint-dir and --checkpoint-every (its commits). "
            f"Received: --checkpoint-dir={args.checkpoint_dir!r} "
            f"--checkpoint-every={args.checkpoint_every}"
        )
    return None


def dataset_dir_problem(flag: str, path: str | None) -> str | None:
    """The problem with a parquet dataset directory option (missing, no Merlin schema), or
    None; ``path`` None (the option not given) is no problem."""
    if path is None:
        return None
    if not os.path.isdir(path):
        return f"{flag} is not a directory. Received: {flag}={path!r}"
    if schema_file_in(path) is None:
        return (
            f"{flag} has no Merlin schema ({' or '.join(SCHEMA_FILES)}; "
            f"NVTabular writes one). Received: {flag}={path!r}"
        )
    return None


def parquet_files_problem(flag: str, path: str | None) -> str | None:
    """The problem with a dataset directory that holds no ``.parquet`` file (a schema only:
    Merlin would try to read the schema as parquet), only files without rows (Merlin's
    loader fails deep in pandas), or a file that is not parquet; or None."""
    if path is None or not os.path.isdir(path):
        return None
    files = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(path)
        for name in names
        if name.endswith(".parquet")
    )
    if not files:
        return f"{flag} holds no .parquet files (only its schema?). Received: {flag}={path!r}"
    return parquet_rows_problem(flag, path, files)


def parquet_rows_problem(flag: str, path: str, files: list[str]) -> str | None:
    """The problem when none of ``files`` (the ``.parquet`` files of ``path``) holds a row,
    or one cannot be read as parquet; None at the first file with rows (reads footers only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in files:
        try:
            rows = pq.ParquetFile(file).metadata.num_rows
        except (OSError, pa.ArrowException) as exc:
            return f"{flag} holds a file that is not parquet ({exc}). Received: {file!r}"
        if rows > 0:
            return None
    return (
        f"{flag} holds no rows: its {len(files)} .parquet file(s) are empty. "
        f"Received: {flag}={path!r}"
    )


def memory_problem(what: str, needed: int, flag: str, value) -> str | None:
    """The problem when ``needed`` bytes (one rank's) exceed this host's available memory
    (or its cgroup's headroom) shared by its ranks, or None (also where neither is known)."""
    host = available_bytes()
    if host is None:
        return None
    available = host // max(1, world()[2])
    if needed <= available:
        return None
    gib = 2**30
    return (
        f"{what} needs {needed / gib:.1f} GiB per rank, more than the "
        f"{available / gib:.1f} GiB of memory available to each rank of this host. "
        f"Received: {flag}={value}"
    )


def report_problem(problem: str, host_dependent: bool) -> None:
    """One line on stderr from rank 0; a host-dependent problem also from the first rank of
    every other host (rank 0 may not see it; the other ranks of a host see what it sees)."""
    rank = world()[1]
    if rank == 0:
        print(f"error: {problem}", file=sys.stderr)
    elif host_dependent and os.environ.get("HOROVOD_LOCAL_RANK", "0") == "0":
        host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
        print(f"error (rank {rank}, host {host}): {problem}", file=sys.stderr, flush=True)
    let_rank_0_speak()


def checked_arguments(option_parser, argv, check_options, check_host):
    """Parsed options, or None after reporting the first problem (options first, then what
    depends on the host), before TensorFlow loads. A command started from its command line
    (``argv`` None) and without ``--no-huge-pages`` starts itself again on huge pages first
    (:mod:`.huge_pages`); one called with ``argv`` runs in its caller's process as it is."""
    quiet_imports()
    args = option_parser.parse_args(argv)
    problem = check_options(args)
    host_problem = None if problem else check_host(args)
    if problem or host_problem:
        report_problem(problem or host_problem, host_dependent=bool(host_problem))
        return None
    if argv is None and getattr(args, "huge_pages", False):
        relaunch_on_huge_pages()
    return args
