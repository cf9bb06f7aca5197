"""The launch environment (launchers.launcher / launch_env / launch_local_rank): what each launcher
sets, as horovodrun, mpirun, SLURM's srun and MPICH's mpiexec set it, read before TensorFlow or
Horovod load. tests/commands/test_launchers.py starts real jobs with them."""

import pytest

from merlin_models_de import launchers

HOROVODRUN = {"HOROVOD_SIZE": "4", "HOROVOD_RANK": "3", "HOROVOD_LOCAL_SIZE": "2",
              "HOROVOD_LOCAL_RANK": "1"}  # fmt: skip
MPIRUN = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
          "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}  # fmt: skip
# task 4 of `srun -N 3 -n 5` (2 tasks on nodes 0 and 1, 1 on node 2), in a batch job
SRUN = {"SLURM_JOB_ID": "17", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_PROCID": "4", "SLURM_NODEID": "2", "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_NTASKS": "5"}  # fmt: skip
# the batch script itself: one process, although the job has 5 tasks
BATCH_SCRIPT = {"SLURM_JOB_ID": "17", "SLURM_PROCID": "0", "SLURM_NTASKS": "5",
                "SLURM_NODEID": "0"}  # fmt: skip
MPIEXEC = {"PMI_SIZE": "3", "PMI_RANK": "2", "MPI_LOCALNRANKS": "3", "MPI_LOCALRANKID": "2"}
# OpenMPI's singleton: a plain process that initialized MPI itself (Merlin's import does)
SINGLETON = {"OMPI_MCA_ess": "singleton", "PMIX_RANK": "0", "OMPI_MCA_orte_ess_num_procs": "1"}


@pytest.mark.parametrize(
    "env, name, world, local_rank",
    [
        (HOROVODRUN, "horovodrun", (4, 3, 2), 1),
        (MPIRUN, "mpirun", (2, 1, 2), 1),
        (SRUN, "srun", (5, 4, 1), 0),
        (dict(SRUN, SLURM_NODEID="1", SLURM_PROCID="3", SLURM_LOCALID="1"), "srun", (5, 3, 2), 1),
        (MPIEXEC, "mpiexec", (3, 2, 3), 2),
        # horovodrun inside an allocation, and horovodrun --mpi (mpirun underneath)
        ({**SRUN, **HOROVODRUN}, "horovodrun", (4, 3, 2), 1),
        (BATCH_SCRIPT, None, (1, 0, 1), 0),
        (SINGLETON, None, (1, 0, 1), 0),
        # a host's share alone (a process told its place among its host's ranks)
        ({"HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}, None, (1, 0, 2), 1),
        ({}, None, (1, 0, 1), 0),
    ],
)
def test_each_launcher_is_read_from_its_own_variables(env, name, world, local_rank):
    assert launchers.launcher(env) == name
    assert launchers.launch_env(env) == world
    assert launchers.launch_local_rank(env) == local_rank


@pytest.mark.parametrize(
    "env, message",
    [
        (
            dict(SRUN, SLURM_NODEID="3"),
            "SLURM_NODEID=3 but SLURM_STEP_TASKS_PER_NODE='2(x2),1' names 3 nodes",
        ),  # fmt: skip
        (
            dict(MPIRUN, OMPI_COMM_WORLD_SIZE="two"),
            "mpirun's environment does not parse: invalid literal for int() with base 10: 'two'",
        ),  # fmt: skip
    ],
)
def test_a_launch_environment_that_contradicts_itself_is_named(env, message):
    with pytest.raises(launchers.LaunchError) as err:
        launchers.launch_env(env)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "hostlist, names",
    [
        ("h1", ["h1"]),
        ("h[1-3,5],gpu07", ["h1", "h2", "h3", "h5", "gpu07"]),
        ("node[008-010]", ["node008", "node009", "node010"]),
    ],
)
def test_slurm_host_lists_are_written_out(hostlist, names):
    assert launchers.hostnames(hostlist) == names


@pytest.mark.parametrize(
    "env, where",
    [
        (
            dict(SRUN, SLURM_STEP_NODELIST="n[1-3]"),
            "ranks 0-1 on n1, ranks 2-3 on n2, rank 4 on n3",
        ),
        (
            dict(SRUN, SLURM_STEP_NODELIST="n[1-3]", SLURM_DISTRIBUTION="cyclic"),
            "ranks 0,3 on n1, ranks 1,4 on n2, rank 2 on n3",
        ),
        (dict(SRUN, SLURM_STEP_NODELIST="n[1-3]", SLURM_DISTRIBUTION="plane=2"), "on n[1-3]"),
        (
            dict(
                SRUN,
                SLURM_STEP_NODELIST="n[1-2]",
                SLURM_STEP_TASKS_PER_NODE="1(x2)",
                SLURM_DISTRIBUTION="arbitrary",
            ),
            "rank 0 on n1, rank 1 on n2",
        ),  # fmt: skip
        (
            dict(SRUN, SLURM_STEP_NODELIST="n[1-10]", SLURM_STEP_TASKS_PER_NODE="1(x10)"),
            ", ".join(f"rank {k - 1} on n{k}" for k in range(1, 9)) + " and 2 nodes more",
        ),
        (MPIRUN, ""),
    ],
)
def test_the_start_line_says_which_node_holds_which_rank(env, where):
    # SLURM names a lost node ("Node failure on h2"): this names its ranks
    assert launchers.placement(env) == where


class _Horovod:
    """What check_launch asks of the Horovod that runs: its world and transport."""

    def __init__(self, size, rank, local_size, mpi=True):
        self.size, self.rank = (lambda: size), (lambda: rank)
        self.local_size = lambda: local_size
        self.mpi_enabled = self.mpi_built = lambda: mpi


def test_a_host_whose_ranks_horovod_counts_otherwise_is_refused():
    env = dict(SRUN, SLURM_NODEID="1", SLURM_PROCID="3", SLURM_STEP_NODELIST="n[1-3]")
    assert launchers.check_launch(_Horovod(5, 3, 2), env) == (
        "merlin_models_de: 5 ranks started by srun (ranks 0-1 on n1, ranks 2-3 on n2, rank 4 "
        "on n3), Horovod over MPI"
    )
    with pytest.raises(launchers.LaunchError) as err:
        launchers.check_launch(_Horovod(5, 3, 1), env)
    assert str(err.value) == (
        "srun put 2 ranks on this host (SLURM_STEP_TASKS_PER_NODE='2(x2),1'), but Horovod (MPI)"
        " counts 1 on it: each rank's share of the host's memory and cores would be wrong; give"
        " every task of a node the same host name"
    )


def test_a_batch_script_gives_horovodrun_the_allocation():
    batch = dict(BATCH_SCRIPT, SLURM_JOB_NODELIST="n[1-3]", SLURM_TASKS_PER_NODE="2(x2),1")
    assert launchers.allocation_hosts(batch) == (5, "n1:2,n2:2,n3:1")
    assert launchers.allocation_hosts(dict(batch, **SRUN)) is None  # a job step: srun placed it
    assert launchers.allocation_hosts({}) is None
    with pytest.raises(launchers.LaunchError, match="names 3 nodes but SLURM_TASKS_PER_NODE='2' "):
        launchers.allocation_hosts(dict(batch, SLURM_TASKS_PER_NODE="2"))
