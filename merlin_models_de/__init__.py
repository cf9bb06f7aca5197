"""merlin_models_de: model-parallel embedding tables for Merlin Models.

``import merlin_models_de`` makes ``merlin.models.tf.DistributedEmbeddings`` this package's
block and installs the Merlin hooks once Merlin Models is imported (one idempotent
registration). The import itself loads neither TensorFlow nor Merlin Models, never initializes
Horovod and never touches devices; the TF-backed names below load on first access.

Everything a user calls is a name of this module (one import path each):

- the block: ``DistributedEmbeddings`` (also ``mm.DistributedEmbeddings``);
- placement: ``make_plan``, ``ShardingPlan``, ``Shard``, ``ShardingType``, ``TableSpec``,
  ``FeatureSpec``, ``tables_from_schema``;
- the block's options: ``PlacementOptions`` (where tables go), ``ExchangeOptions`` (how the
  lookups run);
- checkpoints: ``save_checkpoint``, ``restore_checkpoint``, ``latest_checkpoint``,
  ``CheckpointCallback``, ``read_full_tables``;
- one table in parallel: ``export_table``, ``read_table``, ``iter_table``, ``read_keys`` (a
  dynamic table's keys with their rows);
- custom loops: ``DistributedGradientTape``, ``broadcast_variables``;
- optimizers: ``RowWiseAdagrad`` (one accumulator per table row);
- input: ``loader_dataset`` (a rank's ``mm.Loader`` batches as a native ``tf.data`` pipeline);
- outputs and retrieval: ``TiedCategoricalOutput``, ``ShardedTopK``, ``top_k_model``,
  ``GlobalInBatchSampler``, ``named_tables``;
- serving (one process, the ``serving`` extra): ``load_model``, ``ranking_ensemble``,
  ``save_query_model``, ``build_faiss_index``, ``retrieval_ensemble``;
- errors: ``StorageError`` (a checkpoint, table export or saved model that cannot be read,
  written or taken), ``UnsupportedVersionError``.

Example:
    >>> import merlin_models_de
    >>> import merlin.models.tf as mm  # doctest: +SKIP
    >>> mm.DistributedEmbeddings is merlin_models_de.DistributedEmbeddings  # doctest: +SKIP
    True
"""

from merlin_models_de.compat.versions import UnsupportedVersionError
from merlin_models_de.merlin.register import register
from merlin_models_de.planner import Shard, ShardingPlan, ShardingType
from merlin_models_de.planner import plan as make_plan
from merlin_models_de.tables import DynamicTable, FeatureSpec, TableSpec, tables_from_schema

__version__ = "0.1.0"

# name -> the module that defines it (loaded on first access: most import TensorFlow)
_LAZY = {
    "DistributedEmbeddings": "merlin_models_de.block.layer",
    "PlacementOptions": "merlin_models_de.planner.options",
    "ExchangeOptions": "merlin_models_de.backends.options",
    "named_tables": "merlin_models_de.block.handles",
    "save_checkpoint": "merlin_models_de.persistence.checkpoint",
    "restore_checkpoint": "merlin_models_de.persistence.checkpoint",
    "latest_checkpoint": "merlin_models_de.persistence.checkpoint",
    "read_full_tables": "merlin_models_de.persistence.checkpoint",
    "CheckpointCallback": "merlin_models_de.persistence.checkpoint",
    "StorageError": "merlin_models_de.persistence.io",
    "export_table": "merlin_models_de.persistence.table_export",
    "read_table": "merlin_models_de.persistence.table_export",
    "read_keys": "merlin_models_de.persistence.table_export",
    "iter_table": "merlin_models_de.persistence.table_export",
    "DistributedGradientTape": "merlin_models_de.merlin.training",
    "broadcast_variables": "merlin_models_de.merlin.training",
    "RowWiseAdagrad": "merlin_models_de.kernels.rowwise.adagrad",
    "loader_dataset": "merlin_models_de.merlin.input",
    "OutOfRangeIdsReport": "merlin_models_de.merlin.id_report",
    "out_of_range_ids": "merlin_models_de.merlin.id_report",
    "TiedCategoricalOutput": "merlin_models_de.outputs.tied",
    "ShardedTopK": "merlin_models_de.outputs.topk",
    "top_k_model": "merlin_models_de.outputs.topk",
    "GlobalInBatchSampler": "merlin_models_de.outputs.samplers",
    "load_model": "merlin_models_de.serving.loading",
    "ranking_ensemble": "merlin_models_de.serving.ensemble",
    "save_query_model": "merlin_models_de.serving.retrieval",
    "retrieval_ensemble": "merlin_models_de.serving.retrieval",
    "build_faiss_index": "merlin_models_de.serving.faiss_index",
}

__all__ = sorted(
    [
        "make_plan",
        "Shard",
        "ShardingPlan",
        "ShardingType",
        "DynamicTable",
        "FeatureSpec",
        "TableSpec",
        "tables_from_schema",
        "register",
        "UnsupportedVersionError",
        *_LAZY,
    ]
)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'merlin_models_de' has no attribute {name!r}")


def __dir__():
    return __all__


register()
