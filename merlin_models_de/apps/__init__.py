"""The command-line applications built on the library (the library never imports them).

One folder per command; a command imports only :mod:`~merlin_models_de.apps.common` and the
library, never another command's folder, except that the bench imports the DLRM command it
measures (one way: the DLRM command never imports the bench; tests/unit/test_architecture.py
checks both):

- ``dlrm``: train DLRM under horovodrun (``python -m merlin_models_de.apps.dlrm``,
  ``mmde-dlrm``): its options, its model, its run, its per-epoch report, its elastic run.
- ``next_item``: train a next-item session model, the item table sharded
  (``python -m merlin_models_de.apps.next_item``, ``mmde-next-item``): its run, its
  synthetic sessions, its elastic run.
- ``bench``: the benchmarks (``python -m merlin_models_de.apps.bench``, ``mmde-bench``: the
  DLRM bench), the next-item bench, the capacity search, the step breakdown, the cost model's
  table, their plots.
- ``tools``: the plan (``mmde-plan``), the link probe, the hosts check, the launcher bound to
  one interface; each ``python -m merlin_models_de.apps.tools.<name>``.
- ``common``: what several commands use: ``options``, ``console``, ``optimizers``,
  ``epochs`` (the epoch loop), ``checkpoints`` (save, resume), ``reports`` (a rank's numbers),
  ``cores`` (a rank's threads on its cores), ``synthetic`` data, ``elastic_training``,
  ``schemas`` (a schema from a file, a dataset directory or a synthetic name).
"""
