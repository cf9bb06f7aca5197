"""Plan value types: ShardingType, Shard and ShardingPlan (pure Python).

Example:
    >>> from merlin_models_de.tables import TableSpec, FeatureSpec
    >>> t = TableSpec("a", 10, 4, (FeatureSpec("a", "a"),))
    >>> p = ShardingPlan(2, "basic", (t,), (Shard("a", 0, ShardingType.TABLE_WISE, 0, 10, 0, 4),))
    >>> ShardingPlan.from_dict(p.to_dict()) == p
    True
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from merlin_models_de.tables import TableSpec, human_bytes

# Extra copies of every parameter that an optimizer keeps (its slot variables).
OPTIMIZER_SLOTS = {
    "sgd": 0,
    "adagrad": 1,
    "adam": 2,
    "rmsprop": 1,
    "ftrl": 2,
    "lazyadam": 2,
    "rowwise_adagrad": 0,
}
# Values an optimizer keeps per table row besides (row-wise state: merlin_models_de.kernels.rowwise).
ROW_SLOTS = {"rowwise_adagrad": 1}
# A dynamic table's key map, per row of a rank's share (merlin_models_de.dynamic.keymap): the
# slot arrays (key, count, last step: 3 x int64) and, once every row holds a key, the hash
# index's entry (key and row, 2 x int64, at a load of one half)
KEY_MAP_BYTES_PER_ROW = 3 * 8 + 2 * 2 * 8


class ShardingType(enum.Enum):
    """How one table is laid out across ranks."""

    # The whole table lives on one rank; that rank serves every sample's lookups.
    TABLE_WISE = "table_wise"
    # A range of columns lives on one rank; the table is a few narrower tables downstream.
    COLUMN_WISE = "column_wise"
    # A range of rows lives on each rank; every rank looks up every id, owners answer.
    ROW_WISE = "row_wise"
    # The whole table is replicated on every rank; lookups stay local, gradients allreduce.
    DATA_PARALLEL = "data_parallel"


# Kinds whose shards answer other ranks' lookups through the exchanges.
MODEL_PARALLEL = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)


@dataclass(frozen=True)
class Shard:
    """A rectangle of one table held by one rank.

    Attributes:
        table: Table name.
        rank: Rank that holds the rectangle.
        kind: How the table is sharded.
        row_start, rows: Row range ``[row_start, row_start + rows)``.
        col_start, cols: Column range ``[col_start, col_start + cols)``.

    Example:
        >>> Shard("a", 1, ShardingType.COLUMN_WISE, 0, 10, 8, 8).elements
        80
    """

    table: str
    rank: int
    kind: ShardingType
    row_start: int
    rows: int
    col_start: int
    cols: int

    @property
    def elements(self) -> int:
        """Number of parameters in the shard."""
        return self.rows * self.cols

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable dict."""
        return {
            "table": self.table,
            "rank": self.rank,
            "kind": self.kind.value,
            "row_start": self.row_start,
            "rows": self.rows,
            "col_start": self.col_start,
            "cols": self.cols,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Shard":
        """Inverse of :meth:`to_dict`."""
        return cls(
            d["table"],
            int(d["rank"]),
            ShardingType(d["kind"]),
            int(d["row_start"]),
            int(d["rows"]),
            int(d["col_start"]),
            int(d["cols"]),
        )


@dataclass(frozen=True)
class ShardingPlan:
    """Which rank holds which table, column slice or row slice. Same on every rank.

    ``shards`` lists, rank by rank, the shards in the order that rank stores them locally.

    Example:
        >>> plan.shards_on(0)  # doctest: +SKIP
        >>> print(plan.summary(optimizer="adagrad"))  # doctest: +SKIP
    """

    world_size: int
    strategy: str
    tables: tuple[TableSpec, ...]
    shards: tuple[Shard, ...]
    # what shaped it: thresholds, the cap, work_balanced's step (planning again places the same)
    options: tuple[tuple[str, Any], ...] = field(default=(), hash=False)

    def table(self, name: str) -> TableSpec:
        """The TableSpec called ``name``."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"No table named {name!r} in the plan. Received: name={name!r}")

    def shards_on(self, rank: int) -> tuple[Shard, ...]:
        """The shards held by ``rank``, in local storage order."""
        return tuple(s for s in self.shards if s.rank == rank)

    def shards_of(self, table: str) -> tuple[Shard, ...]:
        """The shards of one table, in rank order."""
        return tuple(sorted((s for s in self.shards if s.table == table), key=lambda s: s.rank))

    def stored_shards_on(self, rank: int) -> tuple[Shard, ...]:
        """The shards a checkpoint stores from ``rank``: its own, except replicated tables,
        which only rank 0 stores (every rank holds the same copy)."""
        return tuple(
            s for s in self.shards_on(rank) if s.kind is not ShardingType.DATA_PARALLEL or rank == 0
        )

    def stored_shards_of(self, table: str) -> tuple[Shard, ...]:
        """The stored shards of one table (see :meth:`stored_shards_on`), in rank order."""
        return tuple(
            s
            for s in self.shards_of(table)
            if s.kind is not ShardingType.DATA_PARALLEL or s.rank == 0
        )

    def kind_of(self, table: str) -> ShardingType:
        """How ``table`` is sharded."""
        return self.shards_of(table)[0].kind

    def rank_elements(self, rank: int) -> int:
        """Embedding parameters held by ``rank``."""
        return sum(s.elements for s in self.shards_on(rank))

    def rank_bytes(
        self,
        rank: int,
        optimizer: str = "sgd",
        dtype_bytes: int = 4,
        slots: int | None = None,
        table_bytes: int | None = None,
    ) -> int:
        """Bytes ``rank`` holds with ``optimizer``'s state: its parameters (``table_bytes``
        each where tables are stored narrower, else ``dtype_bytes``) and ``slots`` copies of
        them (default: the optimizer's), plus its row-wise values per row, plus the key maps
        of its shares of dynamic tables (:data:`KEY_MAP_BYTES_PER_ROW`, every row used)."""
        mine = self.shards_on(rank)
        elements, rows = sum(s.elements for s in mine), sum(s.rows for s in mine)
        held = sum(held_bytes(elements, rows, optimizer, dtype_bytes, table_bytes, slots))
        return held + self.key_map_bytes(rank)

    def key_map_bytes(self, rank: int) -> int:
        """Bytes of ``rank``'s key maps: :data:`KEY_MAP_BYTES_PER_ROW` a row of its shares of
        dynamic tables (every row holding a key)."""
        return KEY_MAP_BYTES_PER_ROW * sum(
            s.rows for s in self.shards_on(rank) if self.table(s.table).dynamic is not None
        )

    def balance(self) -> float:
        """Busiest rank's elements over the mean (1.0 is perfect)."""
        per_rank = [self.rank_elements(r) for r in range(self.world_size)]
        mean = sum(per_rank) / self.world_size
        return max(per_rank) / mean if mean else 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable dict; inverse of :meth:`from_dict`."""
        return {
            "world_size": self.world_size,
            "strategy": self.strategy,
            "tables": [t.to_dict() for t in self.tables],
            "shards": [s.to_dict() for s in self.shards],
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ShardingPlan":
        """Builds a plan from :meth:`to_dict` output."""
        return cls(
            int(d["world_size"]),
            d["strategy"],
            tuple(TableSpec.from_dict(t) for t in d["tables"]),
            tuple(Shard.from_dict(s) for s in d["shards"]),
            tuple(sorted(dict(d.get("options", {})).items())),
        )

    def summary(
        self,
        optimizer: str = "sgd",
        dtype_bytes: int = 4,
        slots: int | None = None,
        table_bytes: int | None = None,
    ) -> str:
        """A text table: per rank shards, rows, parameter bytes and bytes with optimizer slots.

        Args:
            optimizer: Name of the optimizer whose slot copies to count (sgd 0, adagrad 1,
                adam 2 extra copies; rowwise_adagrad one value per row).
            dtype_bytes: Bytes per parameter.
            slots: Extra copies per parameter, where known better than by the name (an
                optimizer's momentum, amsgrad, ...).
            table_bytes: Bytes per stored parameter of 16-bit tables (None: dtype_bytes).
        """
        slots = optimizer_slots(optimizer) if slots is None else slots
        per_row = row_slots(optimizer)
        rows_note = f", +{per_row} value per row" if per_row else ""
        lines = [
            f"ShardingPlan: {len(self.tables)} tables, world_size={self.world_size}, "
            f"strategy={self.strategy}, optimizer={optimizer.lower()} (+{slots} slot "
            f"copies{rows_note})",
            f"{'rank':>4} {'shards':>6} {'rows':>14} {'params':>12} {'with slots':>12}",
        ]
        per_rank, with_slots = [], []
        for rank in range(self.world_size):
            mine = self.shards_on(rank)
            params = sum(s.elements for s in mine) * (table_bytes or dtype_bytes)
            rows = sum(s.rows for s in mine)
            per_rank.append(params)
            with_slots.append(self.rank_bytes(rank, optimizer, dtype_bytes, slots, table_bytes))
            lines.append(
                f"{rank:>4} {len(mine):>6} {rows:>14,} "
                f"{human_bytes(params):>12} {human_bytes(with_slots[-1]):>12}"
            )
        total = sum(per_rank)
        lines.append(
            f"total {human_bytes(total)} params; "
            f"{human_bytes(sum(with_slots))} with slots; "
            f"balance max/mean={self.balance():.3f}"
        )
        return "\n".join(lines)


def optimizer_slots(optimizer: str) -> int:
    """Extra parameter copies an optimizer keeps. Raises ValueError for unknown names."""
    key = str(optimizer).lower()
    if key not in OPTIMIZER_SLOTS:
        raise ValueError(
            f"Unknown optimizer; expected one of {sorted(OPTIMIZER_SLOTS)}. "
            f"Received: optimizer={optimizer!r}"
        )
    return OPTIMIZER_SLOTS[key]


def row_slots(optimizer: str) -> int:
    """Values an optimizer keeps per table row (beyond :func:`optimizer_slots`' copies): 1
    for ``rowwise_adagrad``, else 0. Raises ValueError for unknown names."""
    optimizer_slots(optimizer)  # known
    return ROW_SLOTS.get(str(optimizer).lower(), 0)


def held_bytes(
    elements: int,
    rows: int,
    optimizer: str,
    dtype_bytes: int = 4,
    table_bytes: int | None = None,
    slots: int | None = None,
) -> tuple[int, int]:
    """``(tables, state)``: the bytes of ``elements`` table parameters in ``rows`` rows
    (``table_bytes`` each where tables are stored narrower, else ``dtype_bytes``) and of
    ``optimizer``'s state for them in ``dtype_bytes`` (``slots`` copies, default the
    optimizer's, plus its row-wise values per row). The one count of what a rank holds: the
    plan's :meth:`ShardingPlan.rank_bytes` and the peak model (``planner/memory.py``)."""
    slots = optimizer_slots(optimizer) if slots is None else slots
    tables = elements * (dtype_bytes if table_bytes is None else table_bytes)
    return tables, (elements * slots + rows * row_slots(optimizer)) * dtype_bytes
