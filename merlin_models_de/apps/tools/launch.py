"""``python -m merlin_models_de.apps.tools.launch ARGS``: horovodrun with ``ARGS``, its servers
listening only on the ``--network-interface`` it is given.

Horovod 0.28.1's launcher binds its rendezvous server (which every rank reads and writes for
the whole job) and, for elastic jobs, its driver's service to every interface of the
launching host, whatever ``--network-interface`` says. On a host with a public interface
that exposes them there. This runs Horovod's own launcher with those servers bound to the
interface's address; the workers' elastic services are bound the same way by
:func:`merlin_models_de.elastic.state.run`. Without one ``--network-interface`` it is plain
horovodrun.

Example:
    python -m merlin_models_de.apps.tools.launch --gloo -np 2 -H h1:1,h2:1 \\
        --network-interface mmde0 python -m merlin_models_de.apps.dlrm --rows 20000
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from merlin_models_de.compat import horovod as horovod_compat

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
