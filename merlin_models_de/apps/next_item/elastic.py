"""``python -m merlin_models_de.apps.next_item --elastic``: the next-item run under Horovod
elastic (the epochs and commits: :mod:`merlin_models_de.apps.common.elastic_training`). After the
last epoch every rank evaluates on the held-out sessions (full-catalog top-k)."""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.common.cores import configure_threads
from merlin_models_de.apps.common.elastic_training import train_elastically, write_elastic_report
from merlin_models_de.apps.common.optimizers import optimizer_for
from merlin_models_de.apps.next_item.data import row_slice_threshold
from merlin_models_de.apps.next_item.run import (
    evaluate_catalog,
    model_for,
    parquet_data,
    synthetic_data,
)


def run(args, started: float) -> dict:
    """Trains as ``args`` say, elastically, then evaluates; rank 0 writes the report."""
    configure_threads(args.cpu_threads, bind=False)  # ranks per host change
    import merlin.models.tf as mm  # initializes Horovod under horovodrun

    from merlin_models_de.persistence.export import sample_batch

    read = parquet_data if args.train_dir else synthetic_data
    made = {}  # this world's (schema, train, steps, valid, valid steps), made once per world

    def data():
        world = (comm.size(), comm.rank())
        if world not in made:  # a reset: the loaders of the old world are no use
            made.clear()
            made[world] = read(args, *world)
        return made[world]

    option = args.row_slice_threshold
    built = {}  # the model's evaluate twin (--loss sampled), rebuilt with it

    def build():
        size = comm.size()
        args.row_slice_threshold = option  # the option as given, resolved for these ranks:
        args.row_slice_threshold = row_slice_threshold(args, size)  # the item table re-planned
        schema = data()[0]
        tf.keras.utils.set_random_seed(args.seed + comm.rank())
        model, emb, catalog = model_for(args, schema)
        model(sample_batch(schema))
        model.compile(optimizer=optimizer_for(args))
        if catalog is not model:
            catalog.compile(optimizer=optimizer_for(args))
        built.update(emb=emb, catalog=catalog)
        return model

    pre = mm.SequencePredictLast(schema=data()[0], target=args.item_column)
    _, report = train_elastically(args, started, build, lambda size, rank: data()[1], pre=pre)
    _, _, _, valid, valid_steps = data()
    if valid is not None:
        report["val"] = evaluate_catalog(built["catalog"], valid, valid_steps, pre, "elastic")
    emb = built["emb"]  # the item table as the ranks there are at the end hold it
    report["item_table_kind"] = (
        emb.plan.kind_of(emb[args.item_column].name).name
        if hasattr(emb, "plan")
        else "DATA_PARALLEL"
    )
    write_elastic_report(args, report)
    return report
