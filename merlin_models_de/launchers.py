"""Which launcher started this process and where it put the ranks, read from the launcher's
environment before TensorFlow or Horovod load (horovodrun, OpenMPI's mpirun, SLURM's srun,
MPICH's mpiexec), and the check that the Horovod which runs sees the same world.

Example:
    >>> launcher({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"})
    'srun'
    >>> hostnames("h[1-3,5],gpu07")
    ['h1', 'h2', 'h3', 'h5', 'gpu07']
"""

from __future__ import annotations

import os
import re

# How each launcher tells a process its place: (launcher, size, rank, local size, local rank).
# The first whose variables are set names the launch: horovodrun sets its own on top of a SLURM
# allocation's (horovodrun inside `sbatch`), and `horovodrun --mpi` starts ranks through
# mpirun. SLURM's variables count only inside a job step (`srun`), whose tasks all have
# SLURM_STEP_NUM_TASKS; a batch script has SLURM_PROCID=0 but is one process. An MPI process
# that started itself (OpenMPI's singleton, e.g. a plain process importing Merlin, which
# initializes Horovod) sets none of these.
_LAUNCHERS = (
    ("horovodrun", "HOROVOD_SIZE", "HOROVOD_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_LOCAL_RANK"),
    (
        "mpirun",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    ),
    ("srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID"),
    ("mpiexec", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID"),
)
# the most nodes the start line names one by one
_NAMED_NODES = 8


class LaunchError(RuntimeError):
    """The launcher's environment contradicts itself or the Horovod it starts."""


def _started_by(row, env) -> bool:
    # its size says a launcher started this process (horovodrun's rank too); SLURM_PROCID does
    # not: a batch script has it
    return row[1] in env or (row[0] == "horovodrun" and row[2] in env)


def _launch_row(env) -> tuple:
    """The row of :data:`_LAUNCHERS` of the launcher that started this process; horovodrun's
    otherwise, so that its per-host variables alone still say this process's share of a
    host."""
    return next((row for row in _LAUNCHERS if _started_by(row, env)), _LAUNCHERS[0])


def launcher(env=None) -> str | None:
    """Which launcher started this process ("horovodrun", "mpirun", "srun", "mpiexec"), or
    None for a plain process."""
    env = os.environ if env is None else env
    row = _launch_row(env)
    return row[0] if _started_by(row, env) else None


def _slurm_counts(tasks_per_node: str) -> list[int]:
    """SLURM's compressed task counts per node: "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in tasks_per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    return counts


def _tasks_on_this_node(env) -> int:
    """This node's share of SLURM_STEP_TASKS_PER_NODE ("2(x3),1": 2 on nodes 0-2, 1 on 3)."""
    counts = _slurm_counts(env["SLURM_STEP_TASKS_PER_NODE"])
    node = int(env.get("SLURM_NODEID", 0))
    if node >= len(counts):
        raise LaunchError(
            f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE="
            f"{env['SLURM_STEP_TASKS_PER_NODE']!r} names {len(counts)} nodes"
        )
    return counts[node]


def launch_env(env=None) -> tuple[int, int, int]:
    """(size, rank, local size) from the launcher's environment, without initializing Horovod.

    For command-line checks that must run before TensorFlow or Horovod load.
    """
    env = os.environ if env is None else env
    name, size, rank, local_size, _ = _launch_row(env)
    try:
        local = _tasks_on_this_node(env) if local_size in env and name == "srun" else None
        local = local or int(env.get(local_size, 1))
        return int(env.get(size, 1)), int(env.get(rank, 0)), local
    except ValueError as err:
        raise LaunchError(f"{name}'s environment does not parse: {err}") from None


def launch_local_rank(env=None) -> int:
    """This process's index among the ranks of its host, from the launcher's environment."""
    env = os.environ if env is None else env
    return int(env.get(_launch_row(env)[4], 0))


def hostnames(hostlist: str) -> list[str]:
    """SLURM's compressed host list ("h[1-3,5],gpu07") written out, in its order."""
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            names += [
                f"{prefix}{k:0{len(first)}d}" for k in range(int(first), int(last or first) + 1)
            ]
    return names


def placement(env=None) -> str:
    """Where srun put the ranks, for the start line ("rank 0 on h1, rank 1 on h2"): the step's
    nodes in order and its distribution, so that SLURM's "Node failure on h2" names the ranks
    that were lost. Empty where the launcher does not say (another launcher)."""
    env = os.environ if env is None else env
    nodes = env.get("SLURM_STEP_NODELIST")
    if launcher(env) != "srun" or not nodes:
        return ""
    names, counts = hostnames(nodes), _slurm_counts(env["SLURM_STEP_TASKS_PER_NODE"])
    by_node = _ranks_by_node(counts, env.get("SLURM_DISTRIBUTION", "block").split(":")[0])
    if by_node is None:
        return f"on {nodes}"
    spans = []
    for name, ranks in zip(names, by_node):
        consecutive = ranks == list(range(ranks[0], ranks[0] + len(ranks)))
        if len(ranks) == 1:
            spans.append(f"rank {ranks[0]} on {name}")
        elif consecutive:
            spans.append(f"ranks {ranks[0]}-{ranks[-1]} on {name}")
        else:
            spans.append(f"ranks {','.join(map(str, ranks))} on {name}")
    more = len(spans) - _NAMED_NODES
    return ", ".join(spans[:_NAMED_NODES]) + (f" and {more} nodes more" if more > 0 else "")


def _ranks_by_node(counts: list[int], distribution: str) -> list[list[int]] | None:
    """The ranks srun gives each node: "block" fills a node before the next, "cyclic" deals
    them round robin; None for another distribution (its layout is not in the environment),
    unless every node holds one rank."""
    if distribution not in ("block", "cyclic") and set(counts) != {1}:
        return None
    if distribution != "cyclic":
        starts = [sum(counts[:k]) for k in range(len(counts))]
        return [list(range(start, start + n)) for start, n in zip(starts, counts)]
    by_node, left, rank = [[] for _ in counts], list(counts), 0
    while any(left):
        for node, n in enumerate(left):
            if n:
                by_node[node].append(rank)
                left[node], rank = n - 1, rank + 1
    return by_node


def allocation_hosts(env=None) -> tuple[int, str] | None:
    """Inside a SLURM allocation but not in a job step (a batch script, `salloc`'s shell):
    horovodrun's ``-np`` and ``-H`` for the allocation ((2, "h1:1,h2:1")), from
    SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE; None elsewhere."""
    env = os.environ if env is None else env
    if "SLURM_JOB_NODELIST" not in env or "SLURM_TASKS_PER_NODE" not in env or launcher(env):
        return None
    names = hostnames(env["SLURM_JOB_NODELIST"])
    counts = _slurm_counts(env["SLURM_TASKS_PER_NODE"])
    if len(names) != len(counts):
        raise LaunchError(
            f"SLURM_JOB_NODELIST={env['SLURM_JOB_NODELIST']!r} names {len(names)} nodes but "
            f"SLURM_TASKS_PER_NODE={env['SLURM_TASKS_PER_NODE']!r} counts {len(counts)}"
        )
    return sum(counts), ",".join(f"{name}:{n}" for name, n in zip(names, counts))


def _claims(env) -> dict[str, tuple[str, str]]:
    """Every launcher whose rank and size variables are set, with their values (one set by a
    job script is stale where another launcher started the process)."""
    return {
        row[0]: (env[row[2]], env[row[1]]) for row in _LAUNCHERS if row[1] in env and row[2] in env
    }


def _mix(env, horovod) -> str:
    """Names the variables of launchers other than the one that started this process that
    match the world Horovod sees, or ""."""
    name = launcher(env)
    seen = (str(horovod.rank()), str(horovod.size()))
    others = [other for other, claim in _claims(env).items() if other != name and claim == seen]
    if not others:
        return ""
    row = next(r for r in _LAUNCHERS if r[0] == name)
    return (
        f"{row[2]}={env.get(row[2])!r} and {row[1]}={env.get(row[1])!r} ({name}'s) are set "
        f"beside {others[0]}'s, whose world Horovod sees: unset the stale {name} variables "
        "(a job script or a container image that exports them)"
    )


def _transport_fix(env, horovod) -> str:
    """Why Horovod did not join the launcher's ranks, as the fix to make."""
    if not horovod.mpi_built():
        return "this Horovod has no MPI: build it with HOROVOD_WITH_MPI=1 (README, Installing)"
    if not horovod.mpi_enabled():
        return f"HOROVOD_CONTROLLER={env.get('HOROVOD_CONTROLLER')!r} chose Gloo: unset it"
    return "MPI did not see the other tasks: under SLURM start them with `srun --mpi=pmix`"


def check_launch(horovod, env=None) -> str:
    """After Horovod started: the launcher's world must be Horovod's (a task that srun started
    without MPI, or with a Horovod built without MPI, sees a world of 1 and would train alone),
    and so must the ranks of this host (each rank's share of the host's memory and cores is
    counted with it). Returns the one line that says how this process was launched."""
    env = os.environ if env is None else env
    name = launcher(env)
    size, rank, local = launch_env(env)
    transport = "MPI" if horovod.mpi_enabled() else "Gloo"
    if env.get("HOROVOD_ELASTIC") == "1":  # ranks come and go: Horovod's world is the truth
        return f"merlin_models_de: {horovod.size()} ranks started by {name} (elastic), Gloo"
    if (horovod.size(), horovod.rank()) != (size, rank):
        fix = _mix(env, horovod) or _transport_fix(env, horovod)
        raise LaunchError(
            f"{name} started rank {rank} of {size}, but Horovod ({transport}) sees rank "
            f"{horovod.rank()} of {horovod.size()}: {fix}"
        )
    local_variable = _launch_row(env)[3]
    if name and horovod.local_size() != local:
        raise LaunchError(
            f"{name} put {local} ranks on this host ({local_variable}="
            f"{env.get(local_variable)!r}), but Horovod ({transport}) counts "
            f"{horovod.local_size()} on it: each rank's share of the host's memory and cores "
            "would be wrong; give every task of a node the same host name"
        )
    where = placement(env)
    return (
        f"merlin_models_de: {size} ranks started by {name}"
        + (f" ({where})" if where else "")
        + f", Horovod over {transport}"
    )
