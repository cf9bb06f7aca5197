"""Who sends which ids where, and where each output column comes from (pure Python).

A ``Routing`` is derived from a ShardingPlan and the ordered feature list. It is the same on
every rank; a rank reads its own part with ``rank``.

Example:
    >>> r = Routing.build(plan, features)  # doctest: +SKIP
    >>> r.served[0]  # lookups rank 0 answers for every rank  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from merlin_models_de.planner.types import MODEL_PARALLEL, Shard, ShardingPlan, ShardingType
from merlin_models_de.tables import FeatureSpec


@dataclass(frozen=True)
class Lookup:
    """One feature read from one model-parallel shard on the shard's owner."""

    feature: int  # index into the ordered feature list
    shard: Shard
    multi_hot: bool
    sequence: bool = False  # multi-hot and un-pooled: one vector per id, not per sample


@dataclass(frozen=True)
class Piece:
    """Where some output columns of a feature come from.

    Model-parallel kinds (table / column wise): ``owner`` answers, it is lookup ``index`` in
    ``served[owner]``; data parallel / row wise: the table ``table`` is looked up here.
    """

    kind: ShardingType
    cols: int
    owner: int = -1
    index: int = -1
    table: str = ""


@dataclass(frozen=True)
class Routing:
    """The static routing of one plan. See the module docstring."""

    world_size: int
    features: tuple[FeatureSpec, ...]
    served: tuple[tuple[Lookup, ...], ...]  # per owner rank: one-hot lookups first
    pieces: tuple[tuple[Piece, ...], ...]  # per feature, in column order

    @classmethod
    def build(cls, plan: ShardingPlan, features) -> "Routing":
        """Derives the routing of ``plan`` for ``features`` (the input list order)."""
        features = tuple(features)
        n = plan.world_size
        served = []
        for owner in range(n):
            mine = [s for s in plan.shards_on(owner) if s.kind in MODEL_PARALLEL]
            lookups = [
                Lookup(i, s, f.multi_hot, f.multi_hot and f.combiner is None)
                for s in mine
                for i, f in enumerate(features)
                if f.table == s.table
            ]
            lookups.sort(key=lambda l: l.multi_hot)  # stable: one-hot first
            served.append(tuple(lookups))
        pieces: list[tuple[Piece, ...]] = []
        for i, f in enumerate(features):
            kind = plan.kind_of(f.table)
            if kind is ShardingType.DATA_PARALLEL:
                pieces.append((Piece(kind, plan.table(f.table).dim, table=f.table),))
            elif kind is ShardingType.ROW_WISE:
                pieces.append((Piece(kind, plan.table(f.table).dim, table=f.table),))
            else:
                parts = []
                for s in sorted(plan.shards_of(f.table), key=lambda s: s.col_start):
                    index = next(
                        k for k, l in enumerate(served[s.rank]) if l.feature == i and l.shard == s
                    )
                    parts.append(Piece(s.kind, s.cols, owner=s.rank, index=index))
                pieces.append(tuple(parts))
        return cls(n, features, tuple(served), tuple(pieces))

    def width(self, owner: int) -> int:
        """Output columns per sample that ``owner`` sends back to each rank (pooled lookups;
        un-pooled ones send one row per id, see :meth:`sequences`)."""
        return sum(l.shard.cols for l in self.served[owner] if not l.sequence)

    def sequences(self, owner: int) -> list[tuple[int, Lookup]]:
        """``(index in served[owner], lookup)`` of the un-pooled lookups ``owner`` serves."""
        return [(k, l) for k, l in enumerate(self.served[owner]) if l.sequence]

    def counts(self, owner: int) -> tuple[int, int]:
        """(one-hot lookups, multi-hot lookups) served by ``owner``."""
        mh = sum(1 for l in self.served[owner] if l.multi_hot)
        return len(self.served[owner]) - mh, mh
