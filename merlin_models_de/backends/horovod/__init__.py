"""The built-in backend: TensorFlow ops and Horovod collectives.

``backend`` (:class:`~.backend.HorovodBackend`: variables, shards, the step's stages),
``schedule`` (which collective carries what in a step), ``ahead`` (the next batch's ids, sent
a step ahead), ``backward`` (the rows' backward merged with the dense average), ``exchange``
(queries to every owner and answers back: row slices, the vocab-parallel output),
``table_lookup`` (a table's rows for arbitrary ids), ``wire`` (payload dtypes and packing).

Nothing is imported here: only ``backends/registry.py`` loads the backend.
"""
