"""The command-line applications built on the library (the library never imports them).

- ``plan``: print a placement plan (``merlin-models-de-plan``).
- ``dlrm``: train DLRM under horovodrun (``merlin-models-de-dlrm``); ``dlrm_run`` and
  ``dlrm_report`` are its run and its per-epoch report.
- ``bench``: the benchmark harness (``merlin-models-de-bench``).
- ``next_item``: train a next-item session model, the item table sharded
  (``merlin-models-de-next-item``); ``next_item_run`` its run, ``next_item_data`` its
  synthetic sessions, ``bench_next_item`` its benchmark rows.
- ``cli``: what the training commands share for their options (one-line errors, exit 2).
- ``synthetic``: deterministic per-rank synthetic data shaped like a Merlin schema.
- ``defaults``: values the applications share (learning rates, optimizers).
"""
