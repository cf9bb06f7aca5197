"""PlacementOptions: what the planner is asked for, one frozen value (pure Python).

The block (``DistributedEmbeddings(placement=...)``), :func:`merlin_models_de.planner.plan`
and the commands' parsers all read the placement from one of these; a bad value fails when
the object is made, naming the option and the value received.

Example:
    >>> PlacementOptions("memory_balanced", column_slice_threshold=10_000).strategy
    'memory_balanced'
    >>> PlacementOptions.from_config(PlacementOptions(hotness={"m": 3}).to_config()).hotness
    {'m': 3}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, TypeVar

from merlin_models_de.planner.strategies import STRATEGIES
from merlin_models_de.planner.work import DEFAULT_BATCH_SIZE, DEFAULT_LINK, Workload

T = TypeVar("T")


@dataclass(frozen=True)
class PlacementOptions:
    """Where tables go: the strategy, the thresholds that slice or replicate tables, the step
    ``work_balanced`` predicts and a cap on what a rank holds (every field is one option of
    :func:`merlin_models_de.planner.plan`, which documents it at length).

    Example:
        >>> PlacementOptions(row_slice_threshold=0)
        Traceback (most recent call last):
        ...
        ValueError: row_slice_threshold must be a positive int or None. Received: row_slice_threshold=0
    """

    strategy: str = "basic"  # a name of STRATEGIES: how model-parallel tables are dealt
    column_slice_threshold: int | None = None  # tables above: power-of-two column slices
    row_slice_threshold: int | None = None  # tables at or above: split by rows on every rank
    data_parallel_threshold: int | None = None  # tables at or below: replicated
    batch_size: int = DEFAULT_BATCH_SIZE  # work_balanced's step: samples per rank
    # work_balanced's step: mean ids per sample of multi-hot features (a number or by feature)
    hotness: float | Mapping[str, float] | None = field(default=None, hash=False)
    optimizer: str = "adagrad"  # work_balanced's step: the optimizer whose slots updates write
    link: str = DEFAULT_LINK  # work_balanced's step: a name of planner.cost.LINKS
    max_rank_elements: int | None = None  # no rank holds more embedding parameters

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"Unknown strategy; expected one of {list(STRATEGIES)}. "
                f"Received: strategy={self.strategy!r}"
            )
        for option in (
            "column_slice_threshold",
            "row_slice_threshold",
            "data_parallel_threshold",
            "max_rank_elements",
        ):
            positive_or_none(option, getattr(self, option))
        if isinstance(self.hotness, Mapping):  # a copy: the caller's dict may change later
            object.__setattr__(self, "hotness", dict(self.hotness))
        _ = self.workload  # checks batch_size, hotness, optimizer and link

    @property
    def workload(self) -> Workload:
        """The step ``work_balanced`` places for (:class:`~.work.Workload`)."""
        return Workload(self.batch_size, self.hotness, self.optimizer, self.link)

    def to_config(self) -> dict[str, Any]:
        """The fields as plain JSON values (a Keras config's part)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PlacementOptions:
        """Inverse of :meth:`to_config`; a key that is no field is named."""
        return options_from_config(cls, config, "placement")


def positive_or_none(option: str, value) -> None:
    """Raises ValueError naming ``option`` unless ``value`` is None or an int >= 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{option} must be a positive int or None. Received: {option}={value!r}")


def field_names(cls) -> tuple[str, ...]:
    """The fields of an options dataclass, in order."""
    return tuple(f.name for f in fields(cls))


def options_from_config(cls: type[T], config: Mapping[str, Any], argument: str) -> T:
    """``cls(**config)``, with a key that is none of ``cls``' fields named (``argument``: the
    config's key that held it)."""
    unknown = sorted(set(config) - set(field_names(cls)))
    if unknown:
        raise ValueError(
            f"{argument} has no options {unknown}; its options are {list(field_names(cls))}. "
            f"Received: {argument}={dict(config)!r}"
        )
    return cls(**config)


def from_keywords(
    cls: type[T], given: T | None, keywords: dict[str, Any], argument: str, accepted=None
) -> T:
    """The options of a call that takes them as one object (``argument=given``) or as
    keywords: pops the keywords named in ``accepted`` (default: every field of ``cls``) from
    ``keywords`` and returns ``given``, or ``cls(**popped)`` when ``given`` is None. An
    object and a keyword together raise ValueError naming both (the object holds every
    option, so the keyword would be a second value)."""
    names = field_names(cls) if accepted is None else accepted
    popped = {name: keywords.pop(name) for name in names if name in keywords}
    if given is None:
        return cls(**popped)
    if not isinstance(given, cls):
        raise TypeError(
            f"{argument} must be a {cls.__name__} (or None for the keywords' options). "
            f"Received: {argument}={given!r}"
        )
    if popped:
        both = ", ".join(f"{name}={value!r}" for name, value in popped.items())
        raise ValueError(
            f"{argument}= already gives every one of its options; pass {sorted(popped)} in "
            f"it (dataclasses.replace) or drop {argument}=, not both. "
            f"Received: {both} and {argument}={given!r}"
        )
    return given


__all__ = ["PlacementOptions", "from_keywords", "options_from_config", "positive_or_none"]
