"""Horovod's private API: the allreduce of one ``hvd.DistributedOptimizer`` instance, the
elastic retry loop (its reset and run function), and the address its services bind; and the
local gradients' scaling Horovod 0.28.1 gets wrong under elastic, done here."""

from __future__ import annotations

from merlin_models_de import comm
from merlin_models_de.compat.registry import IN_LAUNCHER, INSTANCE, declare, replace
from merlin_models_de.compat.versions import ensure_supported

_OPTIMIZER = "horovod.tensorflow.keras.DistributedOptimizer"
_ALLREDUCE_GRADS = declare(
    f"{_OPTIMIZER}._allreduce_grads",
    change="averages the gradients with one grouped allreduce per dtype, named the same on "
    "every rank, in plain graph code.",
    why="Horovod's own puts each gradient's allreduce behind a tf.cond in a nested "
    "tf.function (about 1 s of the first step's tracing, a call per gradient per step).",
    library="horovod",
    scope=INSTANCE,
)
_ALLREDUCE = declare(
    f"{_OPTIMIZER}._allreduce",
    change="registers the sharded tables' variables as local (never allreduced, divided by "
    "the world size here) and completes the embedding exchanges waiting for the optimizer "
    "before the allreduce.",
    why="an allreduce of a shard would mix different rows of different ranks; Horovod "
    "0.28.1's own scaling of local gradients fails under elastic (float by int32).",
    library="horovod",
    scope=INSTANCE,
)
_FIND_PORT_USERS = (
    "horovod.runner.util.network",
    "horovod.runner.http.http_server",
    "horovod.runner.common.util.network",
)
_FIND_PORTS = {
    module: declare(
        f"{module}.find_port",
        change="binds the given interface's address only (the same random port search).",
        why="Horovod 0.28.1 binds its rendezvous, elastic driver and notification servers "
        "to every interface whatever --network-interface says.",
        library="horovod",
        when=IN_LAUNCHER,
    )
    for module in _FIND_PORT_USERS
}


def distributed_optimizer(optimizer, is_local, prefix="mmde_grad", merged=None):
    """``hvd.DistributedOptimizer`` around ``optimizer`` that registers every variable for
    which ``is_local(var)`` holds as local, and averages the other gradients with
    :func:`comm.average_gradients` (one grouped allreduce per dtype, named the same on every
    rank, so graph-mode steps pair up; ``prefix`` starts those names: each optimizer of a step
    needs its own).

    ``merged``: ``complete(grads, variables, local)`` of the exchanges whose backward waits
    for the optimizer (``backends/horovod/backward.py``): it returns the gradients with the
    waiting exchanges done and says which global ones it averaged (the allreduce skips
    those)."""
    ensure_supported()
    comm.hvd()  # initialized
    import horovod.tensorflow.keras as hvd_keras
    import tensorflow as tf

    # local gradients are divided by the world size here: Horovod 0.28.1's own scaling
    # divides a float gradient by an int32 size tensor under elastic (a TypeError)
    wrapped = hvd_keras.DistributedOptimizer(
        optimizer, sparse_as_dense=True, scale_local_gradients=False
    )
    allreduce = wrapped._allreduce  # Horovod's, called by the replacement below
    # Horovod's own reduce function puts each gradient's allreduce behind a tf.cond, in a
    # nested tf.function that autograph rewrites: ~1 s of the first step's tracing, and a
    # function call per gradient every step. comm's grouped average is plain graph code.
    average = tf.autograph.experimental.do_not_convert(comm.average_gradients)

    def generic_names(grads, variables=None, use_generic_names=True):
        del variables, use_generic_names
        return average(grads, prefix)

    def register_then_allreduce(grads, variables):
        local = [is_local(var) for var in variables]
        for var, mine in zip(variables, local):
            if mine:
                wrapped.register_local_var(var)
        averaged = [False] * len(local)
        if merged is not None:
            grads, averaged = merged(grads, variables, local)
        rest = allreduce([None if done else g for g, done in zip(grads, averaged)], variables)
        size = float(comm.size())
        return [
            g if done else scaled_local_gradient(r, size) if mine and r is not None else r
            for g, r, done, mine in zip(grads, rest, averaged, local)
        ]

    replace(_ALLREDUCE_GRADS, wrapped, lambda original: generic_names)
    replace(_ALLREDUCE, wrapped, lambda original: register_then_allreduce)
    return wrapped


def scaled_local_gradient(grad, size: float):
    """A local (shard) gradient divided by the world size, dense or ``IndexedSlices``: what
    Horovod's ``scale_local_gradients`` does, done here for the optimizer above, the
    custom loops' tape (``merlin/training.py``) and ``mm.MultiOptimizer``
    (``merlin/optimizers.py``): Horovod 0.28.1's own divides a float gradient by an int32
    size tensor under elastic (a TypeError)."""
    import tensorflow as tf

    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size


def is_horovod_optimizer(optimizer) -> bool:
    """True when ``optimizer`` is already one of Horovod's distributed optimizers."""
    return type(optimizer).__module__.startswith("horovod")


def is_horovod_broadcast_callback(callback) -> bool:
    """True for Horovod's ``BroadcastGlobalVariablesCallback`` (exactly that type)."""
    import horovod.tensorflow.keras as hvd_keras

    return type(callback) is hvd_keras.callbacks.BroadcastGlobalVariablesCallback


def elastic_object_state():
    """Horovod elastic's ``ObjectState`` (counters synced from rank 0, commit / restore / reset
    hooks, host-update checks): the base class of the sharded state."""
    ensure_supported()
    from horovod.tensorflow.elastic import ObjectState

    return ObjectState


def elastic_run(func):
    """Horovod elastic's retry loop around ``func(state)``: sync the state, run; when a rank is
    lost, restore the last commit, re-initialize Horovod with the ranks left and reset.

    Horovod 0.28.1's ``hvd.elastic.run`` turns a failed allreduce / allgather / broadcast into a
    reset, but a failed alltoall (every sharded lookup's exchange) falls through its check
    and the wrapped function returns None, as if training had finished. Here every failed
    Horovod op resets."""
    ensure_supported()
    import os

    import tensorflow as tf
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError
    from horovod.tensorflow.elastic import _reset

    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            if "Horovod" not in (error.message or ""):
                raise
            raise HorovodInternalError(error) from error

    # this worker's notification service (started by run_fn) listens on the job's interface
    if os.environ.get("HOROVOD_GLOO_IFACE"):
        bind_services_to(interface_address(os.environ["HOROVOD_GLOO_IFACE"]))
    return run_fn(wrapper, _reset)


def unwrapped(optimizer):
    """The optimizer a Horovod ``DistributedOptimizer`` was made from (a new instance with its
    configuration; Horovod subclasses the optimizer's class, so that class is its base)."""
    base = type(optimizer).__bases__[0]
    return base.from_config(optimizer.get_config())


def bind_services_to(address: str) -> None:
    """Makes Horovod's own servers in this process listen on ``address`` only.

    Horovod 0.28.1 binds every server it starts, ``('', port)`` in ``find_port``, to all
    interfaces whatever ``--network-interface`` says: horovodrun's rendezvous HTTP server (the
    key-value store every rank reads and writes), its elastic driver's service, and each
    elastic worker's notification service. Its three modules that call ``find_port`` get one
    that binds ``address`` (the same random port search)."""
    ensure_supported()
    import importlib
    import random

    def find_port(server_factory):
        first = random.randrange(1024, 65536)
        for offset in range(65536 - 1024):
            port = 1024 + (first - 1024 + offset) % (65536 - 1024)
            try:
                return server_factory((address, port)), port
            except OSError:
                continue
        raise RuntimeError(f"no free port to bind on {address}")

    for name, patch in _FIND_PORTS.items():
        replace(patch, importlib.import_module(name), lambda original: find_port, again=True)


def interface_address(interface: str) -> str:
    """The IPv4 address of network interface ``interface``; a clear error when it has none."""
    import socket

    import psutil  # a dependency of Horovod's launcher

    found = psutil.net_if_addrs()
    for entry in found.get(interface, []):
        if entry.family == socket.AF_INET:
            return entry.address
    raise ValueError(
        f"network interface {interface!r} has no IPv4 address here (interfaces: "
        f"{sorted(found)}). Received: --network-interface {interface}"
    )


def launcher_interfaces() -> list:
    """The interfaces horovodrun's command line in ``sys.argv`` names (``--network-interface``
    / ``--network-interfaces``, parsed by Horovod's own parser), in its order; [] for none."""
    ensure_supported()
    from horovod.runner.launch import parse_args

    return list(parse_args().nics or [])


def run_launcher() -> None:
    """horovodrun itself, on the command line in ``sys.argv``."""
    ensure_supported()
    from horovod.runner.launch import run_commandline

    run_commandline()
