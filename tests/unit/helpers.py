"""Helpers shared by the tests."""
import numpy as np
import pytest


def diagonal(first, second, ids=(str, str)):
    """Every pair of ``first`` x ``second`` as pytest params (``ids``: how each value is
    named). The CI tier runs the pairs whose indices agree modulo the shorter list's length,
    so each value of both lists runs at least once; the full tier runs them all
    (tests/conftest.py)."""
    n = min(len(first), len(second))
    return [pytest.param(a, b, id=f"{ids[0](a)}-{ids[1](b)}",
                         marks=() if i % n == j % n else pytest.mark.full)
            for i, a in enumerate(first) for j, b in enumerate(second)]


def cat(name, max_id, *, domain_name=None, multi_hot=False, tags=()):
    """A categorical ColumnSchema with cardinality ``max_id + 1``."""
    from merlin.schema import ColumnSchema, Tags

    domain = {"min": 0, "max": max_id}
    if domain_name:
        domain["name"] = domain_name
    return ColumnSchema(name, tags=[Tags.CATEGORICAL, *tags], dtype=np.int64,
                        properties={"domain": domain}, is_list=multi_hot, is_ragged=multi_hot)


def capped_schema(schema, max_id=999):
    """``schema`` with every categorical cardinality capped at ``max_id + 1`` (fast tests)."""
    from merlin_models_de.apps.synthetic import capped_schema as cap

    return cap(schema, max_id + 1)


def synthetic(name, rows, max_id=999):
    """A Merlin synthetic dataset with capped cardinalities."""
    from merlin.datasets.synthetic import generate_data

    from merlin_models_de.schemas import synthetic_schema

    return generate_data(capped_schema(synthetic_schema(name), max_id), rows)


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


def check_plain_run_output(run):
    """Asserts what a plain one-process run of the DLRM command over 2 epochs printed (the
    run itself is tests/unit/test_dlrm.py's single-process run, started without --quiet and
    without logging variables)."""
    summaries = [l for l in run.stdout.splitlines() if l.startswith("epoch ")]
    assert [l.split(":")[0] for l in summaries] == ["epoch 1", "epoch 2"], run.stdout
    assert "Epoch 1/2" not in run.stdout and "Epoch 2/2" not in run.stdout, run.stdout
    both = run.stdout + run.stderr
    assert "is slow compared to the batch time" not in both, both[-3000:]
    assert not [l for l in run.stderr.splitlines()
                if " I tensorflow/" in l or " W tensorflow/" in l], run.stderr[-3000:]
    assert "DistributedEmbeddings runs in one process (not started by horovodrun)" in run.stderr


def collectives(function) -> list:
    """Names of the Horovod collectives in every traced graph of the ``tf.function``
    ``function`` (branches and loops included), sorted."""
    found = []
    for concrete in function._list_all_concrete_functions():  # pylint: disable=protected-access
        graph = concrete.graph.as_graph_def()
        nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
        found += [n.name for n in nodes if n.op.startswith("Horovod")
                  and any(k in n.op for k in _COLLECTIVE_OPS)]
    return sorted(found)


_COLLECTIVE_OPS = ("Alltoall", "Allreduce", "Allgather", "Broadcast", "Reducescatter",
                   "Barrier", "Join")
