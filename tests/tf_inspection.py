"""What a test reads of TensorFlow: its logger's messages, the collectives of a traced graph."""

import re


class TFLogRecords:
    """Context manager: the messages TensorFlow's logger emits inside (Keras' optimizer warns
    through it, e.g. "Gradients do not exist for variables ...")."""

    def __enter__(self):
        import logging

        import tensorflow as tf

        self.messages = []
        outer = self

        class Collect(logging.Handler):
            def emit(self, record):
                outer.messages.append(record.getMessage())

        self._handler, self._logger = Collect(), tf.get_logger()
        self._logger.addHandler(self._handler)
        return self

    def __exit__(self, *exc):
        self._logger.removeHandler(self._handler)
        return False


def collectives(function) -> list:
    """Names of the Horovod collectives in every traced graph of the ``tf.function``
    ``function``, or of one concrete function (branches and loops included), sorted."""
    found = []
    traces = (
        function._list_all_concrete_functions()
        if hasattr(function, "_list_all_concrete_functions")
        else [function]
    )
    for concrete in traces:
        graph = concrete.graph.as_graph_def()
        nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
        found += [
            n.name
            for n in nodes
            if n.op.startswith("Horovod") and any(k in n.op for k in _COLLECTIVE_OPS)
        ]
    return sorted(found)


def collectives_in_order(concrete) -> list:
    """Names of the Horovod collectives of one concrete function in the order the trace made
    them: a node that calls functions (a branch of ``tf.cond``, a loop's body, a call) stands
    for the collectives of its functions, in place; each function is walked once."""
    graph = concrete.graph.as_graph_def()
    library = {f.signature.name: f for f in graph.library.function}
    seen: set = set()

    def walk(nodes):
        out = []
        for n in nodes:
            if n.op.startswith("Horovod") and any(k in n.op for k in _COLLECTIVE_OPS):
                out.append(n.name)
            for attr in n.attr.values():
                called = [attr.func.name] if attr.HasField("func") else []
                called += [f.name for f in attr.list.func]
                for name in called:
                    if name in library and name not in seen:
                        seen.add(name)
                        out += walk(library[name].node_def)
        return out

    return walk(graph.node)


def stage_names_per_trace(function) -> list:
    """Per trace of a ``tf.function`` (Merlin's loader may trace the step twice), its
    collectives in the order the trace made them, each by its name after the block's
    prefix."""
    return [
        [
            re.sub(r"^mmde_.*_[0-9a-f]{8}_", "", name.rsplit("/", 1)[-1])
            for name in collectives_in_order(trace)
        ]
        for trace in function._list_all_concrete_functions()
    ]


_COLLECTIVE_OPS = (
    "Alltoall",
    "Allreduce",
    "Allgather",
    "Broadcast",
    "Reducescatter",
    "Barrier",
    "Join",
)
