"""What a test reads of TensorFlow: its logger's messages, the collectives of a traced graph."""


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


_COLLECTIVE_OPS = (
    "Alltoall",
    "Allreduce",
    "Allgather",
    "Broadcast",
    "Reducescatter",
    "Barrier",
    "Join",
)
