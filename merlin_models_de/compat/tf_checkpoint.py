"""TensorFlow checkpoints' private API: reading a slice of a saved table whatever its layout,
and the deferred dependencies that let a block restore tables by name."""

from __future__ import annotations

from merlin_models_de.compat.registry import INSTANCE, declare, replace

# A Keras checkpoint names a layer's variables by its dependencies. Named after this rank's
# layout (``mp_C1_c4``...), a block saved at one world size would find nothing to match at
# another. So the block has one dependency per table (persistence/keras_checkpoint.py), given
# with the private Trackable hooks below.

VALUE_KEY = "VARIABLE_VALUE"  # what TF calls a variable's one saved tensor

_VARIABLE = "tensorflow.python.ops.resource_variable_ops.ResourceVariable"
_SERIALIZE = declare(
    f"{_VARIABLE}._serialize_to_tensors",
    change="saves this rank's rectangle of a table as a slice of the table's full shape.",
    why="a checkpoint written at one world size must restore at another: the block's "
    "table stand-ins (empty variables of its own) save in the form of partitioned variables.",
    library="tensorflow",
    scope=INSTANCE,
)
_RESTORE = declare(
    f"{_VARIABLE}._restore_from_tensors",
    change="reads only this rank's rectangle of a saved table into its shard.",
    why=_SERIALIZE.why,
    library="tensorflow",
    scope=INSTANCE,
)


def table_slice(storage, first_row, full_shape, start, size, dtype):
    """A stand-in variable for this rank's rectangle of one table in checkpoints.

    It saves the rectangle as a slice of a tensor of the table's full shape (the form of
    TF's partitioned variables), and restores by reading only that rectangle from whatever
    was saved (a whole table, or slices of it) into ``storage``. With ``storage`` None (no
    shard of the table here) it saves and reads nothing. It is itself an empty variable:
    functions in a SavedModel capture the table's variable, and only a variable can stand
    for it (they are never run; the block is rebuilt from its config).

    Args:
        storage: The variable holding the rectangle on this rank, or None.
        first_row: The rectangle's first row inside ``storage`` (backends may stack shards).
        full_shape: ``(rows, dim)`` of the whole table.
        start: ``(row, column)`` of the rectangle in the table.
        size: ``(rows, columns)`` of the rectangle.
        dtype: The table's dtype.
    """
    import tensorflow as tf

    stand_in = tf.Variable(
        tf.zeros([0, full_shape[1]], dtype), trainable=False, name="mmde_table_slice"
    )
    spec = (
        " ".join(str(d) for d in full_shape)
        + " "
        + ":".join(f"{s},{n}" for s, n in zip(start, size))
    )

    def rows():
        if first_row == 0 and tuple(storage.shape) == tuple(size):
            return storage
        return storage[first_row : first_row + size[0]]

    def serialize():
        return {} if storage is None else {VALUE_KEY: {spec: tf.convert_to_tensor(rows())}}

    def restore(restored_tensors):
        return tf.no_op() if storage is None else rows().assign(restored_tensors[VALUE_KEY])

    # TF looks these hooks up on the instance first (saveable_object_util)
    replace(_SERIALIZE, stand_in, lambda original: serialize)
    replace(_RESTORE, stand_in, lambda original: restore)
    return stand_in


class TableCheckpointMixin:
    """Gives a Keras layer the checkpoint form it describes with two methods:

    ``checkpoint_children(children)`` -> the ``{name: trackable}`` to save, from Keras' own;
    ``checkpoint_dependency(name, found)`` -> the trackable a saved ``name`` stands for, given
    what Keras found under that name (None: nothing).
    """

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return self.checkpoint_children(super()._trackable_children(save_type, **kwargs))

    def _lookup_dependency(self, name, *args, **kwargs):
        return self.checkpoint_dependency(name, super()._lookup_dependency(name, *args, **kwargs))


def track_dependency(layer, name, trackable) -> None:
    """Tracks ``trackable`` as ``layer``'s dependency ``name`` (a restore that was waiting for
    that name, the model restored before it was built, happens now), and makes it the
    attribute ``name`` without Keras' attribute tracking: Keras' SavedModel loader sets every
    saved dependency it finds no attribute for, which would make a stand-in a weight."""
    layer._track_trackable(trackable, name=name, overwrite=True)
    object.__setattr__(layer, name, trackable)


def deferred_dependency_names(layer) -> list:
    """Names of saved dependencies that a restore into the unbuilt ``layer`` is waiting for."""
    return list(layer._deferred_dependencies)


def restore_deferred(layer, name, trackable) -> None:
    """Restores into ``trackable`` what a restore saved under ``name`` was waiting for (a
    saved name the layer does not track itself, such as an older layout's table name)."""
    layer._handle_deferred_dependencies(name=name, trackable=trackable)
