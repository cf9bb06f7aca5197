"""A per-rank step-time estimate: the lookups a rank serves, their updates, and its exchanges
(pure Python, no TensorFlow).

Per step, on N ranks with B samples per rank, a rank's predicted milliseconds are

- compute: for every lookup it serves (``Routing.served``; one-process and replicated tables:
  its own B samples), a fixed cost per lookup (the ops launched for it forward, backward and
  in the update), the ids it gathers times the columns (forward gather and backward
  gradient), and the rows the update touches (at most the shard's rows) times the columns
  times the copies the optimizer writes (1 + its slots);
- communication: every collective of :func:`merlin_models_de.planner.cost.step_costs` priced
  by the :class:`~merlin_models_de.planner.cost.Link` on this rank's own bytes: what it sends or
  receives, the larger, less its own share (``(N-1)/N``); an allreduce moves the same wire on
  every rank.

A collective ends on every rank when its busiest rank is done, so the step of every rank is
about the busiest rank's estimate: that is what a placement should make small.

Example:
    >>> from merlin_models_de.tables import TableSpec, FeatureSpec
    >>> from merlin_models_de.planner import plan
    >>> tables = [TableSpec(n, 100, 8, (FeatureSpec(n, n),)) for n in "abc"]
    >>> [r.lookups for r in rank_times(plan(tables, 2), batch_size=4)]
    [2, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from merlin_models_de.planner.cost import ID_BYTES, get_link, step_costs
from merlin_models_de.planner.hotness import check_hotness, ids_per_sample
from merlin_models_de.planner.routing import Routing
from merlin_models_de.planner.types import (
    MODEL_PARALLEL,
    ShardingPlan,
    ShardingType,
    optimizer_slots,
)
from merlin_models_de.tables import FeatureSpec, feature_order

# Samples per rank per step a placement is planned for when none is given: the DLRM command's.
DEFAULT_BATCH_SIZE = 512
DEFAULT_LINK = "gloo-loopback"


@dataclass(frozen=True)
class Compute:
    """The compute of served lookups on one kind of device.

    Attributes:
        lookup_ms: Fixed milliseconds per served lookup and step (ops launched for it).
        element_ns: Nanoseconds per id and column: forward gather plus backward gradient.
        update_ns: Nanoseconds per touched row, column and copy the optimizer writes.
        source: Where the numbers come from.

    Example:
        >>> Compute(1.0, 2.0, 3.0).lookup(ids=1000, cols=10, rows=500, copies=2)
        1.05
    """

    lookup_ms: float
    element_ns: float
    update_ns: float
    source: str = ""

    def lookup(self, ids: int, cols: int, rows: int, copies: int) -> float:
        """Milliseconds of one lookup of ``ids`` ids into ``rows`` rows of ``cols`` columns
        whose update writes ``copies`` copies (a parameter and its optimizer slots)."""
        elements = ids * cols * self.element_ns + min(ids, rows) * cols * copies * self.update_ns
        return self.lookup_ms + elements * 1e-6


CPU_NOTE = (
    "this 2-core host, TF 2.12 CPU, one thread per rank, 2026-12-05: element_ns and "
    "update_ns from timing tf.gather, its gradient and legacy SGD / Adagrad sparse updates of "
    "1,024 ids x 16 columns in tables of 100 to 10M rows (3.1-6.0 ns per id x column with "
    "SGD, 3.1-9.3 with Adagrad); lookup_ms fitted to the bench's step breakdown (train_step "
    "alone, Criteo, 2 ranks x 512), memory_optimized against work_balanced in 4 interleaved "
    "pairs: 1.26-2.00 ms (mean 1.63) less with SGD, 1.52-1.99 (1.76) with Adagrad; "
    "0.06 ms predicts 1.63 and 1.88; all timed before SGD's adds ran in pieces and Adagrad's "
    "table rows were written back (the update paths of merlin_models_de.kernels.scatter)"
)
GPU_NOTE = (
    "assumed, not measured: an A100 gathers and scatters random rows at about 1 TB/s of "
    "HBM (4 bytes an element read and written), and a lookup launches a few fused kernels "
    "(~10 us)"
)
# by link name: the device whose ranks the link joins
COMPUTE: dict[str, Compute] = {
    "gloo-loopback": Compute(lookup_ms=0.06, element_ns=1.0, update_ns=2.5, source=CPU_NOTE),
    "nvlink-nccl": Compute(lookup_ms=0.01, element_ns=0.008, update_ns=0.008, source=GPU_NOTE),
    "infiniband-nccl": Compute(lookup_ms=0.01, element_ns=0.008, update_ns=0.008, source=GPU_NOTE),
}


@dataclass(frozen=True)
class RankTime:
    """One rank's predicted milliseconds per step.

    Attributes:
        rank: The rank.
        lookups: Lookups it serves (model parallel; row-sliced and replicated lookups count
            on every rank).
        compute_ms: Its lookups' gathers, gradients and updates.
        comm_ms: Its part of the step's collectives.
    """

    rank: int
    lookups: int
    compute_ms: float
    comm_ms: float

    @property
    def total_ms(self) -> float:
        """Compute plus communication."""
        return self.compute_ms + self.comm_ms


@dataclass(frozen=True)
class Workload:
    """The step a placement is planned for (``plan(strategy="work_balanced")``).

    Attributes:
        batch_size: Samples per rank per step.
        hotness: Mean ids per sample of multi-hot features: one number or a dict by feature
            (read by :func:`merlin_models_de.planner.hotness.ids_per_sample`).
        optimizer: Its slots are copies the update writes.
        link: A name of ``planner.cost.LINKS``; its device's :data:`COMPUTE` prices lookups.

    Example:
        >>> from merlin_models_de.tables import TableSpec, FeatureSpec
        >>> t = TableSpec("a", 100, 8, (FeatureSpec("a", "a"),))
        >>> round(Workload(4, link="nvlink-nccl").slice_ms(t, 8, 2), 6)
        0.010003
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    hotness: float | Mapping[str, float] | None = None
    optimizer: str = "adagrad"
    link: str = DEFAULT_LINK

    def __post_init__(self):
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch_size must be an int >= 1. Received: batch_size={b!r}")
        check_hotness(self.hotness)
        optimizer_slots(self.optimizer)
        get_link(self.link)

    def slice_ms(self, table, cols: int, world_size: int) -> float:
        """Milliseconds a step that serving ``cols`` columns of ``table`` (every feature that
        reads it) costs the owner: :func:`serve_ms`."""
        copies = 1 + optimizer_slots(self.optimizer)
        return sum(
            serve_ms(
                int(self.batch_size * ids_per_sample(f, self.hotness)),
                cols,
                table.rows,
                world_size,
                copies,
                self.link,
                out_rows=self.batch_size if f.combiner is not None else None,
            )
            for f in table.features
        )


def serve_ms(
    ids: int,
    cols: int,
    rows: int,
    world_size: int,
    copies: int,
    link: str,
    out_rows: int | None = None,
    exchange_bytes: int = 4,
) -> float:
    """Milliseconds a rank spends serving one model-parallel lookup of ``ids`` ids per rank
    (every rank's: ``world_size * ids``) from ``rows`` x ``cols``: its compute and the bytes
    it moves for it off-rank (the ids in, ``out_rows`` rows per rank out and their gradients
    back in; default ``ids``: one-hot or un-pooled, a pooled lookup sends one per sample)."""
    n, out_rows = world_size, ids if out_rows is None else out_rows
    wire = (n - 1) * (ID_BYTES * ids + 2 * out_rows * cols * exchange_bytes)
    beta = get_link(link).beta_gbps
    return COMPUTE[link].lookup(n * ids, cols, rows, copies) + wire / (beta * 1e9) * 1e3


def _compute(plan, routing, batch_size, hotness, copies, compute) -> list[float]:
    n, per_rank = plan.world_size, [0.0] * plan.world_size
    for owner in range(n):
        for lookup in routing.served[owner]:
            ids = int(n * batch_size * ids_per_sample(routing.features[lookup.feature], hotness))
            per_rank[owner] += compute.lookup(ids, lookup.shard.cols, lookup.shard.rows, copies)
    for f in routing.features:
        kind = plan.kind_of(f.table)
        if kind in (ShardingType.DATA_PARALLEL, ShardingType.ROW_WISE):
            table = plan.table(f.table)
            ids = int(batch_size * ids_per_sample(f, hotness))
            asked = ids * (n if kind is ShardingType.ROW_WISE else 1)
            rows = table.rows if kind is ShardingType.DATA_PARALLEL else table.rows // n
            # replicated: a dense allreduced gradient, so the update writes the whole table
            touched = table.rows if kind is ShardingType.DATA_PARALLEL and n > 1 else asked
            cost = compute.lookup(asked, table.dim, min(rows, touched), copies)
            per_rank = [t + cost for t in per_rank]
    return per_rank


def rank_times(
    plan: ShardingPlan,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    link: str = DEFAULT_LINK,
    optimizer: str = "adagrad",
    features: Sequence[FeatureSpec] | None = None,
    hotness: float | Mapping[str, float] | None = None,
    dense_params: int = 0,
    allreduce_rounds: int = 1,
    exchange_bytes: int | None = None,
) -> tuple[RankTime, ...]:
    """Every rank's predicted milliseconds per step (see the module docstring).

    Args:
        plan: The placement.
        batch_size: Samples per rank per step.
        link: A name of ``planner.cost.LINKS``; its device's :data:`COMPUTE` prices the
            lookups.
        optimizer: Its slots are copies the update writes.
        features, dense_params, allreduce_rounds, exchange_bytes: As
            :func:`~merlin_models_de.planner.cost.step_costs`.
        hotness: Mean ids per sample of multi-hot features
            (:func:`merlin_models_de.planner.hotness.ids_per_sample`).

    Raises:
        ValueError: naming the option and the value received.
    """
    price = get_link(link)
    copies = 1 + optimizer_slots(optimizer)
    features = tuple(feature_order(plan.tables) if features is None else features)
    costs = step_costs(
        plan,
        batch_size,
        features=features,
        hotness=hotness,
        dense_params=dense_params,
        allreduce_rounds=allreduce_rounds,
        exchange_bytes=exchange_bytes,
    )
    routing = Routing.build(plan, features)
    compute = _compute(plan, routing, batch_size, hotness, copies, COMPUTE[link])
    n, out = plan.world_size, []
    local = sum(1 for f in features if plan.kind_of(f.table) not in MODEL_PARALLEL)
    for rank in range(n):
        comm = 0.0
        for c in costs.collectives:
            own = (n - 1) * max(c.sent[rank], c.received[rank]) // n
            comm += price.time_ms(c.kind, c.wire if c.kind == "allreduce" else own)
        out.append(RankTime(rank, len(routing.served[rank]) + local, compute[rank], comm))
    return tuple(out)


def busiest_ms(times: Sequence[RankTime]) -> float:
    """The busiest rank's predicted milliseconds: about every rank's step."""
    return max(t.total_ms for t in times)
