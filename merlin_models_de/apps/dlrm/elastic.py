"""``python -m merlin_models_de.apps.dlrm --elastic``: the DLRM run under Horovod elastic
(the epochs and commits: :mod:`merlin_models_de.apps.common.elastic_training`)."""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.common.cores import configure_threads
from merlin_models_de.apps.common.elastic_training import train_elastically, write_elastic_report
from merlin_models_de.apps.common.optimizers import optimizer_for
from merlin_models_de.apps.dlrm.model import datasets_for, metrics, model_for


def _built(args):
    """The compiled model for the ranks there are now (tables re-planned for them)."""
    from merlin_models_de.persistence.export import sample_batch

    schema = datasets_for(args, comm.size(), comm.rank())[0]
    tf.keras.utils.set_random_seed(args.seed + comm.rank())
    model, _ = model_for(args, schema)
    model(sample_batch(schema))
    model.compile(optimizer=optimizer_for(args), metrics=metrics())
    return model


def run(args, started: float) -> dict:
    """Trains as ``args`` say, elastically; rank 0 writes and returns the report."""
    configure_threads(args.cpu_threads, bind=False)  # ranks per host change
    import merlin.models.tf as mm  # noqa: F401  (initializes Horovod under horovodrun)

    _, report = train_elastically(
        args, started, lambda: _built(args), lambda size, rank: datasets_for(args, size, rank)[1]
    )
    write_elastic_report(args, report)
    return report
