"""Optimizers that keep one state value per table row instead of one per element.

- :mod:`.adagrad`: ``RowWiseAdagrad``, the optimizer a user compiles with;
- :mod:`.columns`: a column-sliced table's row statistics made whole across its slices.

Example:
    >>> import merlin_models_de as mmde
    >>> model.compile(optimizer=mmde.RowWiseAdagrad(0.05))  # doctest: +SKIP
"""
