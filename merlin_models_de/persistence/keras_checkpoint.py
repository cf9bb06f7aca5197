"""The block in TF checkpoints and SavedModels: one dependency per table, whatever the layout.

Keras' SavedModel loader rebuilds the block from its config (at the loading world size, so
it plans its own shards), then restores variables by the names of the block's dependencies.
Named after this rank's layout, the tables of a model saved in one process (``mp_C1``, whole)
match nothing on a rank that holds ``mp_C1_c4`` or no part of ``C1``: the loader then revives
every unmatched table whole, attaches it to the block (so each rank trains a different set
of variables, and the first allreduce hangs), or fails on a variable it cannot match.

So the block's dependency for table ``T`` is ``table_T`` on every rank and world size:

- where this rank holds the whole table in one variable (one process, replicated tables,
  table-wise shards): that variable, saved and restored like any other;
- otherwise a stand-in (:func:`merlin_models_de.compat.tf_checkpoint.table_slice`) that saves this rank's
  rectangle as a slice of the full table and restores by reading only that rectangle (TF
  reads the stored tensor and copies the rectangle out: a rank reads each table it holds a
  part of whole, one at a time, and keeps only its part); on a rank without a part of ``T``
  it saves and reads nothing.

A model that ``save`` exported under horovodrun (one process, whole tables) therefore loads
on any number of ranks, sharded as a fresh block, as well as in one process without Horovod.
Names of the older layout form (``mp_T``, ``dp_T``, ``rw_T``: whole tables of one process)
are read as ``table_T``; a saved slice of a layout (``mp_T_c4``) cannot be, and fails on
every rank alike (every rank reads the same names), naming it.

Example:
    >>> block.table_checkpoints.children["table_C1"]  # doctest: +SKIP
"""

from __future__ import annotations

import re

from merlin_models_de.compat import tf_checkpoint

PREFIX = "table_"
_LAYOUT_NAME = re.compile(r"^(mp|dp|rw)_(.+)$")  # the horovod backend's variable names
_COLUMN_SLICE = re.compile(r"^(.+)_c(\d+)$")
_STORAGE_LAYERS = ("engine_layers",)  # the block's attribute holding a backend's sublayers


class TableCheckpoints:
    """One built block's table dependencies (a plain object: Keras does not track it).

    Args:
        block: A built ``DistributedEmbeddings``.
    """

    def __init__(self, block):
        self.tables = {t.name: t for t in block.tables}
        self.children = {PREFIX + t.name: _child(block, t) for t in block.tables}
        self.storage = {
            id(block.backend.shard_variable(s)[0]) for s in block.plan.shards_on(block.rank)
        }
        for name, child in self.children.items():
            tf_checkpoint.track_dependency(block, name, child)
        # a restore into the unbuilt block waits under the saved names: older layout names too
        for name in tf_checkpoint.deferred_dependency_names(block):
            table = layout_table(name, self.tables)
            if table is not None:
                tf_checkpoint.restore_deferred(block, name, self.children[PREFIX + table])

    def to_save(self, children: dict) -> dict:
        """Keras' dependencies of the block, with the tables' storage replaced by the table
        dependencies (storage is named after the layout; sublayers hold storage too)."""
        out = {
            name: child
            for name, child in children.items()
            if name not in _STORAGE_LAYERS and id(child) not in self.storage
        }
        out.update(self.children)
        return out

    def lookup(self, name: str, found):
        """The dependency a saved ``name`` stands for (``found``: Keras' own answer)."""
        if name in self.children:
            return self.children[name]
        table = layout_table(name, self.tables)
        return self.children[PREFIX + table] if table is not None else found


def layout_table(name: str, tables) -> str | None:
    """The table a layout-form name saved a whole of, or None; raises for a slice."""
    match = _LAYOUT_NAME.match(name)
    if match is None:
        return None
    rest = match.group(2)
    if rest in tables:
        return rest
    column = _COLUMN_SLICE.match(rest)
    if column is not None and column.group(1) in tables:
        raise ValueError(
            f"The saved model holds a column slice of table '{column.group(1)}' (saved on "
            f"several ranks in an older layout form), which cannot be loaded into another "
            f"layout; save it with model.save() under horovodrun (whole tables) or with "
            f"merlin_models_de.persistence.checkpoint. Received: name={name!r}"
        )
    return None


def _child(block, table):
    """The variable itself, or a stand-in for this rank's part (see the module docstring)."""
    mine = [s for s in block.plan.shards_on(block.rank) if s.table == table.name]
    if len(mine) > 1:  # the planner merges a rank's slices of one table
        raise ValueError(
            f"Rank {block.rank} holds {len(mine)} rectangles of table "
            f"'{table.name}'; expected one. Received: shards={mine}"
        )
    full = (table.rows, table.dim)
    dtype = block.backend.dtype
    if not mine:
        return tf_checkpoint.table_slice(None, 0, full, (0, 0), (0, 0), dtype)
    shard = mine[0]
    variable, first = block.backend.shard_variable(shard)
    if first == 0 and tuple(variable.shape) == full:
        return variable
    return tf_checkpoint.table_slice(
        variable, first, full, (shard.row_start, shard.col_start), (shard.rows, shard.cols), dtype
    )
