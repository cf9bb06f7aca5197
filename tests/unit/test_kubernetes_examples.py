"""examples/kubernetes: the TrainJob (Kubeflow Trainer's MPI runtime) and the MPIJob (the MPI
Operator) parse, start `mpirun` with the package's real command, whose options its own parser
accepts, and mount every path the command reads or writes in the pods that run the ranks. No
Kubernetes cluster runs here (docs/multihost.md, Kubernetes)."""

import importlib.util
import pathlib

import pytest
import yaml

from merlin_models_de.apps.dlrm import options as dlrm_options

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "kubernetes"


def _trainjob(doc):
    spec = doc["spec"]
    mounts = [
        m["mountPath"]
        for o in spec["podTemplateOverrides"]
        if {"name": "node"} in o["targetJobs"]
        for c in o["spec"]["containers"]
        for m in c["volumeMounts"]
    ]
    return spec["trainer"]["command"], mounts


def _mpijob(doc):
    replicas = doc["spec"]["mpiReplicaSpecs"]
    (launcher,) = replicas["Launcher"]["template"]["spec"]["containers"]
    mounts = [
        m["mountPath"]
        for c in replicas["Worker"]["template"]["spec"]["containers"]
        for m in c["volumeMounts"]
    ]
    return launcher["command"], mounts


@pytest.mark.parametrize(
    "name, kind, read",
    [("trainjob.yaml", "TrainJob", _trainjob), ("mpijob.yaml", "MPIJob", _mpijob)],
)
def test_the_manifest_runs_the_dlrm_command_with_options_it_takes(name, kind, read):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert doc["kind"] == kind
    command, mounts = read(doc)
    assert command[0] == "mpirun"
    module_at = command.index("-m") + 1
    assert command[module_at - 2] == "python"
    assert command[module_at] == dlrm_options.MODULE
    assert importlib.util.find_spec(command[module_at]) is not None
    options = dlrm_options.parser().parse_args(command[module_at + 1 :])  # exits 2 if unknown
    paths = [options.train_dir, options.valid_dir, options.checkpoint_dir]
    for path in paths:
        assert any(path.startswith(mount + "/") for mount in mounts), (path, mounts)
