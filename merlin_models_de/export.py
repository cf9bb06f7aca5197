"""Export a distributed model as a plain single-process SavedModel (full tables).

Every rank takes part (the tables are gathered collectively, in chunks); rank 0 rebuilds
the model at world size 1, copies the dense weights and the full tables into it, and saves
it with Merlin's own ``save``. The result loads in a process without Horovod.

Example:
    >>> model.save("export/")  # under horovodrun; every rank calls it  # doctest: +SKIP
"""
from __future__ import annotations

from merlin_models_de import comm
from merlin_models_de.variables import dense_weights, embedding_blocks


def sample_batch(schema, rows: int = 2):
    """A small batch shaped like ``schema``'s inputs (used to build a rebuilt model).

    Built from Merlin's synthetic generator without a Loader: under Horovod the Loader
    broadcasts a shuffling seed, a collective only rank 0 would join here.
    """
    import numpy as np
    import tensorflow as tf
    from merlin.datasets.synthetic import generate_data
    from merlin.schema import Tags

    inputs = schema.excluding_by_tag(Tags.TARGET)
    frame = generate_data(inputs, rows).to_ddf().compute()
    batch = {}
    for col in inputs:
        values = frame[col.name].to_list()
        if col.is_list or col.is_ragged:
            batch[col.name] = tf.ragged.constant([list(v) for v in values])
        else:
            batch[col.name] = tf.constant(np.asarray(values).reshape(-1, 1))
    return batch


def save_single_process(model, save, export_path, *args, **kwargs):
    """Collective: rank 0 saves a world-size-1 copy of ``model`` with full tables."""
    blocks = embedding_blocks(model)
    tables = [b.get_global_weights() for b in blocks]
    error = None
    if comm.rank() == 0:
        try:
            _save_rank0(model, blocks, tables, save, export_path, *args, **kwargs)
        except Exception as err:  # pylint: disable=broad-except  # re-raised on every rank
            error = f"{type(err).__name__}: {err}"

    # every rank learns the outcome, so a failed export fails everywhere instead of hanging
    error = comm.broadcast_object(error, root_rank=0, name="mmde_export_status")
    if error is not None:
        raise RuntimeError(f"Exporting the model from rank 0 failed: {error}")


def _save_rank0(model, blocks, tables, save, export_path, *args, **kwargs):
    dense = [w.numpy() for w in dense_weights(model, blocks)]
    with comm.single_process():
        clone = model.__class__.from_config(model.get_config())
        clone(sample_batch(model.schema))
        clone_blocks = embedding_blocks(clone)
        targets = dense_weights(clone, clone_blocks)
        if [t.shape for t in targets] != [d.shape for d in dense]:
            raise ValueError("The rebuilt single-process model does not match the trained "
                             "one; cannot export. Received dense shapes "
                             f"{[d.shape for d in dense]} vs {[t.shape for t in targets]}")
        for var, value in zip(targets, dense):
            var.assign(value)
        for block, arrays in zip(clone_blocks, tables):
            block.set_global_weights(arrays)
        save(clone, export_path, *args, **kwargs)
