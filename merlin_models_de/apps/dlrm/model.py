"""The DLRM model and its input as the DLRM options say (:mod:`.options`): built by the
command's run, its elastic run and the bench's step breakdown alike."""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de.apps.common.dynamic import dynamic_tables
from merlin_models_de.apps.common.options import LOCAL_TABLES, exchange_of, placement_of
from merlin_models_de.compat import merlin as merlin_compat


def datasets_for(args, size, rank):
    """(schema, train batches, valid batches or None) for this rank: a ``tf.data`` pipeline
    over the batches Merlin's ``Loader`` gives (``--input tf.data``, scalar columns), or the
    ``Loader`` itself."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    from merlin_models_de.apps.common.schemas import load_schema, synthetic_schema
    from merlin_models_de.apps.common.synthetic import capped_schema, rank_dataset
    from merlin_models_de.merlin.input import loader_dataset

    def batches(ds, **local):
        if args.input == "tf.data" and not any(c.is_list for c in ds.schema):
            return loader_dataset(ds, args.batch_size, **local)
        loader = mm.Loader(ds, batch_size=args.batch_size, shuffle=False, drop_last=True)
        # local: the rows are this rank's already (no sharding by partition, no seed broadcast)
        return merlin_compat.take_local_rows(loader) if local else loader

    if args.train_dir:
        schema = load_schema(args.train_dir)

        def from_files(path):
            ds = Dataset(path, engine="parquet", schema=schema)
            if ds.npartitions < size:
                ds = ds.repartition(npartitions=size)
            return batches(ds)

        return (
            schema,
            from_files(args.train_dir),
            from_files(args.valid_dir) if args.valid_dir else None,
        )
    schema = capped_schema(synthetic_schema(args.dataset), args.max_table_rows, args.table_scale)
    valid_rows = args.rows // 10 if args.valid_rows is None else args.valid_rows

    def local(rows, seed):
        ds = rank_dataset(schema, rows, args.batch_size, size, rank, seed)
        return batches(ds, rank=0, world_size=1)

    valid = local(valid_rows, args.seed + 1) if valid_rows >= args.batch_size * size else None
    return schema, local(args.rows, args.seed), valid


def model_for(args, schema):
    import merlin.models.tf as mm
    from merlin.schema import Tags

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    if args.embeddings in ("merlin", LOCAL_TABLES):
        emb = mm.Embeddings(schema.select_by_tag(Tags.CATEGORICAL), dim=args.dim)
    else:
        emb = mm.DistributedEmbeddings(
            schema,
            dim=args.dim,
            placement=placement_of(args),
            exchange=exchange_of(args),
            dynamic_tables=dynamic_tables(args, schema),
        )
    label = schema.select_by_tag(Tags.BINARY_CLASSIFICATION).column_names
    if len(label) != 1:
        raise ValueError(f"The schema needs exactly one binary target column. Received: {label}")
    model = mm.DLRMModel(
        schema,
        embeddings=emb,
        bottom_block=mm.MLPBlock(list(args.bottom_mlp) + [args.dim]),
        top_block=mm.MLPBlock(list(args.top_mlp)),
        prediction_tasks=mm.BinaryClassificationTask(label[0]),
    )
    return model, emb


def metrics() -> list:
    """The metrics the command compiles with (every training step updates them)."""
    return [tf.keras.metrics.AUC(name="auc"), tf.keras.metrics.BinaryCrossentropy(name="logloss")]
