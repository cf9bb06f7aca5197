"""Export a distributed model as a plain single-process SavedModel (full tables).

Every rank takes part (the tables are gathered collectively, in chunks); rank 0 rebuilds
the model at world size 1, copies the dense weights and the full tables into it, and saves
it with Merlin's own ``save``. The result loads in a process without Horovod.

The SavedModel is written beside the old one (``.tmp-<id>-<name>`` in the same directory),
flushed to disk, and only then put in its place in one step (an atomic exchange of the two
directories; where the file system cannot, two renames, the old one moved to
``.trash-<id>-<name>`` first); the old one is then deleted. Until then the old SavedModel
stays whole: a save that fails on any rank, or is killed, never leaves new variables under
an old graph. A killed save leaves its ``.tmp-*`` directory behind (delete it).

Example:
    >>> model.save("export/")  # under horovodrun; every rank calls it  # doctest: +SKIP
"""

from __future__ import annotations

from merlin_models_de import comm
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.compat import merlin as merlin_compat
from merlin_models_de.persistence.io import write_whole
from merlin_models_de.runtime import agree
from merlin_models_de.variables import dense_weights, embedding_blocks


def sample_batch(schema, rows: int = 2) -> dict:
    """A small batch shaped like ``schema``'s inputs (targets excluded), to build a model.

    In the form Merlin's ``Loader`` feeds a model: scalars ``[rows]``, fixed-length lists
    ``[rows, k]``, ragged lists as ``{name}__values`` and ``{name}__offsets``; ids inside their
    domain. The form matters beyond building: a Keras model's first call fixes the inputs of
    the serving signature its SavedModel gets, and Merlin Systems (``PredictTensorflow``) feeds
    the Loader's column names (a ragged tensor here became an input named ``args_0``). Neither
    Merlin's synthetic generator (it needs an item-id column) nor a Loader (under Horovod it
    broadcasts a shuffling seed, a collective only rank 0 would join here).
    """
    import tensorflow as tf
    from merlin.schema import Tags

    batch = {}
    for col in schema.excluding_by_tag(Tags.TARGET):
        value = _column_batch(col, rows)
        if isinstance(value, tf.RaggedTensor):
            batch[f"{col.name}__values"] = value.flat_values
            batch[f"{col.name}__offsets"] = value.row_splits
        elif not (col.is_list or col.is_ragged):
            batch[col.name] = tf.reshape(value, [rows])
        else:
            batch[col.name] = value
    return batch


def batch_like(model, batch: dict) -> dict:
    """``batch`` (:func:`sample_batch`) in the form ``model`` was first called with.

    Keras keeps a model's first inputs as its save spec, and the SavedModel of it serves (and
    reloads) exactly that form: scalars ``[B]`` or ``[B, 1]``, ragged lists as ragged tensors
    or as ``__values`` / ``__offsets``. The export's one-process copy is called with this, so
    its SavedModel takes what the trained model took, as a one-process save would. Anything
    the spec does not describe: ``batch`` unchanged.
    """
    import tensorflow as tf

    spec = model.save_spec() if hasattr(model, "save_spec") else None
    inputs = spec[0][0] if spec and spec[0] else None
    if not isinstance(inputs, dict):
        return batch
    out = {}
    for name, want in inputs.items():
        if name in batch:
            value = batch[name]
            if isinstance(want, tf.TensorSpec) and want.shape.rank == value.shape.rank + 1:
                value = tf.expand_dims(value, -1)  # [B] -> [B, 1]
            elif isinstance(want, tf.TensorSpec) and want.shape.rank == value.shape.rank - 1:
                value = tf.squeeze(value, -1) if value.shape[-1] == 1 else None
        elif isinstance(want, tf.RaggedTensorSpec) and f"{name}__values" in batch:
            value = tf.RaggedTensor.from_row_splits(
                batch[f"{name}__values"], batch[f"{name}__offsets"]
            )
        else:
            value = None
        if value is None:
            return batch
        out[name] = value
    return out


def _column_batch(col, rows: int):
    import numpy as np
    import tensorflow as tf

    if not (col.is_list or col.is_ragged):
        return tf.constant(_values(col, rows).reshape(rows, 1))
    fixed = _fixed_length(col)
    if fixed is not None and not col.is_ragged:
        return tf.constant(_values(col, rows * fixed).reshape(rows, fixed))
    count = col.value_count
    low = max(1, (count.min or 0) if count else 0)  # no empty rows: every row looks up
    high = max(low, (count.max or low + 1) if count else low + 1)
    lengths = np.array([low + i % (high - low + 1) for i in range(rows)], np.int64)
    return tf.RaggedTensor.from_row_lengths(_values(col, int(lengths.sum())), lengths)


def _fixed_length(col):
    """k for a fixed-length list column, else None."""
    dims = col.shape.dims if col.shape is not None else None
    if dims and len(dims) > 1 and dims[1].min is not None and dims[1].min == dims[1].max:
        return int(dims[1].min)
    count = col.value_count
    if count and count.min is not None and count.min == count.max and count.min > 0:
        return int(count.min)
    return None


def _values(col, count: int):
    """``count`` values of the column's dtype, cycling through its domain."""
    import numpy as np

    dtype = _numpy_dtype(col)
    if np.issubdtype(dtype, np.integer):
        domain = col.int_domain
        low = int(domain.min or 0) if domain else 0
        high = int(domain.max) if domain and domain.max is not None else low
        return (low + np.arange(count) % (high - low + 1)).astype(dtype)
    if np.issubdtype(dtype, np.bool_):
        return np.arange(count) % 2 == 0
    domain = col.float_domain
    least = float(domain.min or 0.0) if domain else 0.0
    most = float(domain.max) if domain and domain.max is not None else least + 1.0
    return np.full(count, (least + most) / 2, dtype)


def _numpy_dtype(col):
    """The column's NumPy dtype; int64 ids / float32 values where the schema has none."""
    import numpy as np
    from merlin.schema import Tags

    try:
        return np.dtype(col.dtype.to_numpy)
    except Exception:  # noqa: BLE001  # merlin's "unknown" dtype raises
        return np.dtype(np.int64 if Tags.CATEGORICAL in col.tags else np.float32)


def save_single_process(model, save, export_path, *args, **kwargs):
    """Collective: rank 0 saves a world-size-1 copy of ``model`` with full tables, replacing
    what ``export_path`` held in one step (see the module doc)."""
    blocks = embedding_blocks(model)
    tables = [b.get_global_weights() for b in blocks]
    maps = [b.dynamic_maps() for b in blocks]  # dynamic tables' keys, in the rows' order
    agree.on_rank_zero(
        "exporting the model from rank 0",
        lambda: _save_rank0(model, blocks, tables, maps, save, export_path, *args, **kwargs),
    )


def _save_rank0(model, blocks, tables, maps, save, export_path, *args, **kwargs):
    dense = [w.numpy() for w in dense_weights(model, blocks)]
    with comm.single_process(), keras_compat.keras_names_kept():  # names: the same on every rank
        clone = model.__class__.from_config(model.get_config())
        # or the config it saves rebuilds another model (see merlin_compat.match_schemas)
        merlin_compat.match_schemas(model, clone, opaque=tuple({type(b) for b in blocks}))
        clone(batch_like(model, sample_batch(model.schema)))
        clone_blocks = embedding_blocks(clone)
        targets = dense_weights(clone, clone_blocks)
        if [t.shape for t in targets] != [d.shape for d in dense]:
            raise ValueError(
                "The rebuilt single-process model does not match the trained "
                "one; cannot export. Received dense shapes "
                f"{[d.shape for d in dense]} vs {[t.shape for t in targets]}"
            )
        for var, value in zip(targets, dense):
            var.assign(value)
        for block, arrays, dynamic in zip(clone_blocks, tables, maps):
            block.set_global_weights(arrays)
            block.set_dynamic_maps(dynamic)
        write_whole(export_path, lambda path: save(clone, path, *args, **kwargs))
