"""The block's placement and exchange options: one object each, or today's keywords.

``DistributedEmbeddings`` takes ``placement=`` (:class:`~merlin_models_de.planner.options.
PlacementOptions`) and ``exchange=`` (:class:`~merlin_models_de.backends.options.
ExchangeOptions`), or the keywords that name their options one by one (as configs saved
before the objects existed hold them). Its config holds the two objects' fields under
``placement`` and ``exchange``. No TensorFlow here.

Example:
    >>> kwargs = {"strategy": "memory_balanced", "validate_ids": False, "dtype": "float32"}
    >>> placement, exchange = block_options(None, None, kwargs)
    >>> placement.strategy, exchange.validate_ids, kwargs
    ('memory_balanced', False, {'dtype': 'float32'})
"""

from __future__ import annotations

from typing import Any, Mapping

from merlin_models_de.backends.options import ExchangeOptions
from merlin_models_de.planner.options import PlacementOptions, field_names, from_keywords

# The block's placement keywords (the planner's other options, the step ``work_balanced``
# predicts and the cap per rank, come only in a PlacementOptions)
PLACEMENT_KEYWORDS = (
    "strategy",
    "column_slice_threshold",
    "row_slice_threshold",
    "data_parallel_threshold",
)
EXCHANGE_KEYWORDS = field_names(ExchangeOptions)  # every exchange option is also a keyword


def block_options(
    placement: PlacementOptions | None, exchange: ExchangeOptions | None, kwargs: dict
) -> tuple[PlacementOptions, ExchangeOptions]:
    """The block's two option objects: ``placement`` / ``exchange``, else made of the
    keywords :data:`PLACEMENT_KEYWORDS` / :data:`EXCHANGE_KEYWORDS` (popped from ``kwargs``);
    a keyword given with its object raises ValueError naming both."""
    return (
        from_keywords(PlacementOptions, placement, kwargs, "placement", PLACEMENT_KEYWORDS),
        from_keywords(ExchangeOptions, exchange, kwargs, "exchange", EXCHANGE_KEYWORDS),
    )


def options_config(placement: PlacementOptions, exchange: ExchangeOptions) -> dict[str, Any]:
    """The config entries of the two objects (read back by :func:`from_options_config`)."""
    return {"placement": placement.to_config(), "exchange": exchange.to_config()}


def from_options_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its ``placement`` / ``exchange`` entries as objects; a config saved
    with the keywords (no such entries) is returned as it is, and the block reads them."""
    out = dict(config)
    if isinstance(out.get("placement"), Mapping):
        out["placement"] = PlacementOptions.from_config(out["placement"])
    if isinstance(out.get("exchange"), Mapping):
        out["exchange"] = ExchangeOptions.from_config(out["exchange"])
    return out


__all__ = [
    "EXCHANGE_KEYWORDS",
    "PLACEMENT_KEYWORDS",
    "block_options",
    "from_options_config",
    "options_config",
]
