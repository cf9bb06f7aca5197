"""``python -m merlin_models_de.apps.tools.launch ARGS``: horovodrun with ``ARGS``, its servers
listening only on the ``--network-interface`` it is given.

Horovod 0.28.1's launcher binds its rendezvous server (which every rank reads and writes for
the whole job) and, for elastic jobs, its driver's service to every interface of the
launching host, whatever ``--network-interface`` says. On a host with a public interface
that exposes them there. This runs Horovod's own launcher with those servers bound to the
interface's address; the workers' elastic services are bound the same way by
:func:`merlin_models_de.elastic.state.run`. Without one ``--network-interface`` it is plain
horovodrun.

Inside a SLURM allocation (an ``sbatch`` script), without hosts given, the ranks go where the
allocation's tasks are: ``-H`` from SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE, and ``-np``
their sum unless given.

Example:
    python -m merlin_models_de.apps.tools.launch --gloo -np 2 -H h1:1,h2:1 \\
        --network-interface mmde0 python -m merlin_models_de.apps.dlrm --rows 20000
"""

from __future__ import annotations

import sys

from merlin_models_de import launchers

_HOST_FLAGS = ("-H", "--hosts", "-hostfile", "--hostfile", "--host-discovery-script")
_COUNT_FLAGS = ("-np", "--num-proc")


def _with_allocation_hosts(argv: list) -> list:
    """``argv`` with ``-np`` and ``-H`` of the SLURM allocation this runs in, where no hosts
    are given."""
    found = launchers.allocation_hosts()
    if found is None or any(a.split("=")[0] in _HOST_FLAGS for a in argv):
        return argv
    tasks, hosts = found
    count = [] if any(a.split("=")[0] in _COUNT_FLAGS for a in argv) else ["-np", str(tasks)]
    print(f"note: hosts from the SLURM allocation: -H {hosts}", file=sys.stderr)
    return [*count, "-H", hosts, *argv]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from merlin_models_de.compat import horovod as horovod_compat

    argv = _with_allocation_hosts(argv)
    sys.argv = ["horovodrun", *argv]
    interfaces = horovod_compat.launcher_interfaces()  # Horovod's own parser reads sys.argv
    if len(interfaces) > 1:  # Horovod picks the ranks' one among them (from a set)
        print(
            f"note: {len(interfaces)} interfaces given ({','.join(interfaces)}): the "
            "launcher's servers listen on all interfaces, as horovodrun's do; give one "
            "--network-interface to bind them to it",
            file=sys.stderr,
        )
    elif interfaces:
        try:  # the address the ranks are told to reach the launcher at
            address = horovod_compat.interface_address(interfaces[0])
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        horovod_compat.bind_services_to(address)
    horovod_compat.run_launcher()
    return 0


if __name__ == "__main__":
    sys.exit(main())
