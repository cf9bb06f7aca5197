"""Merlin's last-item prediction batches as a data pipeline hands them to Keras: Merlin's
synthetic sequence data read by ``mm.Loader``, each batch prepared by ``mm.PrepareFeatures``
(scalar features become ``[B, 1]``) and cut by ``mm.SequencePredictLast`` (the target is each
session's last item), fed through a Keras ``Sequence``. Keras traces the step with every
dimension unknown, so the scalar id features arrive as ``(None, None)``."""

import tensorflow as tf

ROWS, BATCH = 64, 16


def last_item_data(every_row_here=False):
    """``(batches, scalar features' schema, target's schema)``. ``every_row_here``: under
    horovodrun, each rank reads all of its own (one-partition) dataset."""
    import merlin.models.tf as mm
    from merlin.datasets.synthetic import generate_data
    from merlin.schema import Tags

    from merlin_models_de.compat.merlin import take_local_rows

    data = generate_data("sequence-testing", ROWS)
    schema = data.schema.select_by_tag(Tags.CATEGORICAL)
    data.schema = schema
    target = schema.select_by_tag(Tags.ITEM_ID).column_names[0]
    loader = mm.Loader(data, batch_size=BATCH, drop_last=True, shuffle=False)
    if every_row_here:
        take_local_rows(loader)
    prepare = mm.PrepareFeatures(schema)
    predict_last = mm.SequencePredictLast(schema=schema.select_by_tag(Tags.SEQUENCE), target=target)
    scalars = schema.excluding_by_tag(Tags.SEQUENCE)

    class LastItemBatches(tf.keras.utils.Sequence):
        def __len__(self):
            return len(loader)

        def __getitem__(self, index):
            x, y = predict_last(prepare(loader[index][0]))
            return {name: x[name] for name in scalars.column_names}, y

    return LastItemBatches(), scalars, schema.select_by_name(target)


def last_item_model(make_embeddings, scalars, target_schema):
    """A model over the scalar id features, predicting the last item (compiled, graph mode)."""
    import merlin.models.tf as mm

    tf.keras.utils.set_random_seed(1)
    model = mm.Model(
        mm.InputBlockV2(scalars, categorical=make_embeddings(scalars)),
        mm.MLPBlock([8]),
        mm.CategoricalOutput(target_schema, default_loss="categorical_crossentropy"),
    )
    model.compile(optimizer="adam", run_eagerly=False)
    return model
