"""The benchmarks: ``python -m merlin_models_de.apps.bench`` runs the DLRM bench (``dlrm``);
``python -m merlin_models_de.apps.bench.<name>`` the others: ``next_item``, ``capacity``,
``step_breakdown`` (launched by the DLRM bench), ``cost``, ``arrivals`` (also
``python -m merlin_models_de.apps.bench arrivals``: fixed against dynamic tables where ids
keep arriving). ``runs`` launches the runs and
writes the results, ``plots`` draws them.

Results go to ``runs/bench`` (git-ignored) unless ``--out`` says otherwise; ``--out bench``
rewrites the published results that docs/benchmarks.md quotes.
"""
