"""A hand-written next-item model on NVTabular sessions (examples/preprocess.py), trained
on N ranks with the item table split across them, then exported for serving.

    horovodrun -np 2 -H localhost:2 python examples/train_next_item.py OUT/sessions --epochs 2

Reads OUT/sessions/{train,valid}; writes OUT/sessions/model (a single-process SavedModel,
written by rank 0 with the full tables) and OUT/sessions/items (the item table, each rank
writing the rows it holds; nothing gathered). Runs in one process too (no horovodrun).

The model: the session's item ids (a list column from NVTabular's Groupby) through
``mm.DistributedEmbeddings`` (mean of the item vectors), an MLP, and Merlin's
``mm.CategoricalOutput`` tied to the item table; trained to predict each session's last item
(``mm.SequencePredictLast``).
"""

import argparse
import os


def item_column(schema, directory: str = "") -> str:
    """The item-id list column (``item_id_list`` from preprocess.py): the one list column
    tagged ITEM and ID, as the next-item command finds it (Groupby's ``item_id_count``
    carries the tags too, but is a scalar)."""
    from merlin_models_de.apps.next_item.data import item_sequence_column

    name, _ = item_sequence_column(schema, "sessions_dir", directory)
    return name


def build_model(schema, dim: int = 16, row_slice_threshold=None):
    """(model, its embedding block) for ``schema``'s item-id list column. On several ranks
    the item table is row-sliced when it has at least ``row_slice_threshold`` elements."""
    import merlin.models.tf as mm

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)

    item = item_column(schema)
    inputs = schema.select_by_name([item])
    block = mm.DistributedEmbeddings(
        inputs, dim=dim, sequence_combiner="mean", row_slice_threshold=row_slice_threshold
    )
    model = mm.Model(
        mm.InputBlockV2(inputs, categorical=block),
        mm.MLPBlock([dim]),
        mm.CategoricalOutput(to_call=block[item]),
    )
    return model, block


def predict_last(schema):
    import merlin.models.tf as mm

    item = item_column(schema)
    return mm.SequencePredictLast(schema=schema.select_by_name([item]), target=item)


def loader(directory: str, batch_size: int):
    """Merlin's Loader over the item column (each rank its own partitions)."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    data = Dataset(directory, engine="parquet")
    schema = data.schema.select_by_name([item_column(data.schema, directory)])
    return mm.Loader(
        Dataset(directory, engine="parquet", schema=schema),
        batch_size=batch_size,
        shuffle=False,
        drop_last=True,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sessions_dir", help="examples/preprocess.py's OUT/sessions")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32, help="sessions per rank per step")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument(
        "--row-slice-threshold",
        type=int,
        default=1024,
        help="elements from which the item table is split by rows",
    )
    args = parser.parse_args(argv)

    import tensorflow as tf

    from merlin_models_de import export_table
    from merlin_models_de.apps.common.epochs import equal_steps_for

    train = loader(os.path.join(args.sessions_dir, "train"), args.batch_size)
    valid = loader(os.path.join(args.sessions_dir, "valid"), args.batch_size)
    tf.keras.utils.set_random_seed(0)
    model, block = build_model(train.schema, args.dim, args.row_slice_threshold)
    model.compile(optimizer=tf.keras.optimizers.legacy.Adam(args.learning_rate))
    steps = equal_steps_for(train, "train")  # ranks with more batches stop with the others
    model.fit(
        train, epochs=args.epochs, steps_per_epoch=steps, verbose=2, pre=predict_last(train.schema)
    )
    metrics = model.evaluate(
        valid,
        steps=equal_steps_for(valid, "valid"),
        verbose=0,
        return_dict=True,
        pre=predict_last(valid.schema),
    )
    print({k: round(float(v), 4) for k, v in metrics.items() if "at_10" in k or k == "loss"})

    model.save(os.path.join(args.sessions_dir, "model"))  # every rank; rank 0 writes
    export_table(block, item_column(train.schema), os.path.join(args.sessions_dir, "items"))


if __name__ == "__main__":
    main()
