"""The DLRM command: ``python -m merlin_models_de.apps.dlrm`` (``__main__``), its ``run``,
its per-epoch ``report`` and its ``elastic`` run."""
