"""A dynamic table's lookup: every rank's keys to every rank, each owner answers for its own.

The exchange of a row-sliced table (:func:`.exchange.ask_owners`), with the owner
chosen by the key (:func:`.keys.owner_of`) and the row by the owner's :class:`.keymap.KeyMap`:

1. every rank's keys (and row lengths) go to every rank (allgathers): every rank sees the
   step's keys in one order, rank 0's batch first, as one process with the whole batch;
2. in a training step each owner first feeds its keys to its map (admission, eviction) and
   starts the rows it gave to new keys afresh (``reset``);
3. each owner answers for its keys with their rows, plus one more column that counts the
   keys it has no row for (they read the default row); other ranks' keys get zeros;
4. the partial answers go back to the ranks that asked (an all-to-all) and are summed;
   each sample gets ``rows + (keys without a row) * default row``.

Only the rows of keys that have one are gathered, so an optimizer updates exactly those
rows (a zero gradient on some other row would still move Adam's moments). The default row
is a replicated weight, trained like the dense layers.
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.horovod.exchange import ask_owners, every_rank
from merlin_models_de.backends.lookup import named_gather, pooled
from merlin_models_de.dynamic.keys import owner_of


def dynamic_lookup(
    var,
    default_row,
    keymap,
    ids,
    name: str,
    *,
    training: bool,
    reset=None,
    lengths=None,
    combiner=None,
    dtype=None,
):
    """This rank's rows of a dynamic table: ``[samples, dim]`` (pooled) or one row per id.

    Args:
        var: This rank's rows of the table (its slice).
        default_row: ``[1, dim]`` replicated row of keys without a row.
        keymap: This rank's :class:`.keymap.KeyMap`.
        ids: This rank's keys, flat int64.
        name: The collectives' common name; every rank passes the same.
        training: Feed the keys to the map (admission, eviction) before looking up.
        reset: ``reset(rows, keys)`` starts the rows given to new keys afresh (training).
        lengths: Row lengths of multi-hot keys; None for one-hot.
        combiner: How multi-hot keys of a sample pool; None with ``lengths``: one row per key.
        dtype: The dtype rows are read into (None: ``var``'s).
    """
    n, rank = comm.size(), comm.rank()
    dtype = dtype or var.dtype
    dim = var.shape[1]
    sequence = lengths is not None and combiner is None

    def answer(all_ids, all_lengths):
        owned = tf.equal(owner_of(all_ids, n), rank) if n > 1 else tf.ones_like(all_ids, tf.bool)
        if training:
            taken, placed = keymap.update(tf.boolean_mask(all_ids, owned))
            if reset is not None:
                reset(taken, placed)
        slots = keymap.lookup(all_ids)
        present = tf.logical_and(owned, slots >= 0)
        at = tf.where(present)
        rows = named_gather(var, tf.boolean_mask(slots, present), f"{name}_gather", dtype)
        size = tf.shape(all_ids, out_type=tf.int64)[0]
        answers = tf.concat(
            [
                tf.scatter_nd(at, rows, tf.stack([size, tf.constant(dim, tf.int64)])),
                tf.cast(tf.logical_and(owned, ~present), dtype)[:, None],
            ],
            axis=1,
        )
        if lengths is not None and not sequence:
            answers = pooled(answers, all_lengths, combiner)
        return answers

    summed = ask_owners(ids, answer, every_rank(dim + 1), name, lengths=lengths, sequence=sequence)
    return summed[:, :dim] + summed[:, dim:] * tf.cast(default_row, dtype)
