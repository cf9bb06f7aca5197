"""Options of how the exchange runs that every backend reads (no TensorFlow import).

:class:`ExchangeOptions` holds them as one frozen value: the block takes it
(``DistributedEmbeddings(exchange=...)``) and the commands' parsers build it, so a bad value
fails before TensorFlow loads, naming the option and the value received. The exchange dtype
is the float looked-up rows and their gradients cross ranks in; a backend that cannot narrow
them says so (``EmbeddingBackend.unsupported``).

Example:
    >>> exchange_dtype_name("bfloat16")
    'bfloat16'
    >>> ExchangeOptions(backend="horovod", exchange_dtype="bfloat16").merge_backward
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from merlin_models_de.backends.registry import check_name
from merlin_models_de.planner.options import options_from_config
from merlin_models_de.tables import table_dtype_name

EXCHANGE_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class ExchangeOptions:
    """How the block's lookups run: the backend, the id check, the dtypes rows travel and
    are stored in, and the two ways a training step saves an exchange round
    (``DistributedEmbeddings`` documents each at length).

    Example:
        >>> ExchangeOptions(exchange_ahead="no")
        Traceback (most recent call last):
        ...
        ValueError: exchange_ahead must be True or False. Received: exchange_ahead='no'
    """

    backend: str = "auto"  # auto, horovod or distributed-embeddings (backends/registry.py)
    validate_ids: bool = True  # an id outside its table fails, naming feature and id
    exchange_dtype: str | None = None  # rows cross ranks in float16 / bfloat16; None: as is
    table_dtype: str | None = None  # sharded tables stored in bfloat16 / float16; None: as is
    exchange_ahead: bool = True  # fit sends the next batch's ids with this step's rows
    merge_backward: bool = True  # the rows' gradients ride the dense gradients' all-to-all

    def __post_init__(self):
        check_name(self.backend)
        for option in ("validate_ids", "exchange_ahead", "merge_backward"):
            value = getattr(self, option)
            if not isinstance(value, bool):
                raise ValueError(f"{option} must be True or False. Received: {option}={value!r}")
        # a tf.DType given is kept as its name (a config holds names)
        object.__setattr__(self, "exchange_dtype", exchange_dtype_name(self.exchange_dtype))
        object.__setattr__(self, "table_dtype", table_dtype_name(self.table_dtype))

    def to_config(self) -> dict[str, Any]:
        """The fields as plain JSON values (a Keras config's part)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ExchangeOptions:
        """Inverse of :meth:`to_config`; a key that is no field is named."""
        return options_from_config(cls, config, "exchange")


def exchange_dtype_name(value) -> str | None:
    """``value`` (None, a name or a ``tf.DType``) as a name from EXCHANGE_DTYPES, or None.

    Raises ValueError naming the option and the value received.
    """
    if value is None:
        return None
    name = getattr(value, "name", value)  # a tf.DType, or its name
    if not isinstance(name, str) or name not in EXCHANGE_DTYPES:
        raise ValueError(
            f"exchange_dtype must be None (rows travel in the block's dtype) or "
            f"one of {list(EXCHANGE_DTYPES)}. Received: exchange_dtype={value!r}"
        )
    return name


__all__ = ["EXCHANGE_DTYPES", "ExchangeOptions", "exchange_dtype_name"]
