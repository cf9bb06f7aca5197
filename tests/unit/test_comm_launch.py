"""The launch environment (comm.launcher / launch_env / launch_local_rank): what each launcher
sets, as horovodrun, mpirun, SLURM's srun and MPICH's mpiexec set it, read before TensorFlow or
Horovod load. tests/commands/test_launchers.py starts real jobs with them."""

import pytest

from merlin_models_de import comm

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
    assert comm.launcher(env) == name
    assert comm.launch_env(env) == world
    assert comm.launch_local_rank(env) == local_rank


@pytest.mark.parametrize(
    "env, message",
    [
        (
            dict(SRUN, SLURM_NODEID="3"),
            "SLURM_NODEID=3 but SLURM_STEP_TASKS_PER_NODE='2(x2),1' " "names 3 nodes",
        ),  # fmt: skip
        (
            dict(MPIRUN, OMPI_COMM_WORLD_SIZE="two"),
            "mpirun's environment does not parse: " "invalid literal for int() with base 10: 'two'",
        ),  # fmt: skip
    ],
)
def test_a_launch_environment_that_contradicts_itself_is_named(env, message):
    with pytest.raises(comm.LaunchError) as err:
        comm.launch_env(env)
    assert str(err.value) == message
