"""merlin_models_de: model-parallel embedding tables for Merlin Models.

``import merlin_models_de`` makes ``merlin.models.tf.DistributedEmbeddings`` this package's
block (one idempotent registration, done when ``merlin.models.tf`` is or gets imported). The
import itself loads neither TensorFlow nor Merlin Models, never initializes Horovod and never
touches devices; the TF-backed names below load on first access.

Example:
    >>> import merlin_models_de
    >>> import merlin.models.tf as mm  # doctest: +SKIP
    >>> mm.DistributedEmbeddings is merlin_models_de.DistributedEmbeddings  # doctest: +SKIP
    True
"""
from merlin_models_de._register import register
from merlin_models_de.planner import Shard, ShardingPlan, ShardingType
from merlin_models_de.planner import plan as make_plan
from merlin_models_de.tables import FeatureSpec, TableSpec, tables_from_schema

__version__ = "0.1.0"
# The planner function is exported as ``make_plan`` (also ``merlin_models_de.planner.plan``):
# ``merlin_models_de.plan`` is the plan command's module.
__all__ = ["DistributedEmbeddings", "make_plan", "Shard", "ShardingPlan", "ShardingType",
           "FeatureSpec", "TableSpec", "tables_from_schema", "register"]

_LAZY = {"DistributedEmbeddings": "merlin_models_de.layer"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'merlin_models_de' has no attribute {name!r}")


register()
