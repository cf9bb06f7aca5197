"""Tables that grow: 64-bit keys get rows as they arrive, sharded by key.

A dynamic table (:class:`merlin_models_de.tables.DynamicTable`) is a row-sliced table of
``capacity`` rows. Each key has one owner rank (:func:`.keys.owner_of`, a hash of the key
that does not depend on the plan); the owner's :class:`.keymap.KeyMap` gives it a row of its
slice once it has been seen ``admit_after`` times, evicts by the table's policy when the slice
is full, and resets a taken row and its optimizer state (:mod:`.reset`). Until a key has a
row it reads the table's default row, one trainable row shared by every rank. The built-in
backend's exchange (``backends/horovod/dynamic_exchange.py``) sends every rank's keys to every
rank; each owner answers for its keys, and the partial rows are summed where they were asked
for. Nothing here imports a backend.
"""
