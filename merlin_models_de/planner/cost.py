"""A per-step cost model of the built-in backend's collectives (pure Python, no TensorFlow).

:func:`step_costs` lists the collectives one training step of a ``DistributedEmbeddings``
block runs on N ranks with the horovod backend (``backends/horovod.py``), with the bytes every
rank puts in and gets out, followed by Horovod's allreduce of the dense gradients.
:func:`predict` prices them with a latency-bandwidth (alpha-beta) model of a link.

Per step, N > 1 ranks, per-rank batch B, ids and row lengths int64:

- forward ``ids`` all-to-all: to each owner a 2-number header, B ids per one-hot lookup it
  serves and B row lengths per multi-hot lookup it serves;
- forward ``values`` all-to-all (when any rank serves a multi-hot lookup): the multi-hot ids;
- forward ``vectors`` all-to-all (when any pooled lookup is served): each owner sends each
  rank ``B x sum(cols)`` of the pooled lookups it serves; ``sequences`` (un-pooled lookups):
  one row per id;
- per row-sliced feature: allgather of its ids (and row lengths when multi-hot), and an
  all-to-all of the partial rows;
- backward: the float all-to-alls again, reversed (ids carry no gradient);
- the allreduce of the dense gradients and of the data-parallel tables (dense: Horovod runs
  with ``sparse_as_dense``), in ``allreduce_rounds`` fused rounds.

Example:
    >>> from merlin_models_de.tables import TableSpec, FeatureSpec
    >>> from merlin_models_de.planner import plan
    >>> tables = [TableSpec(n, 100, 8, (FeatureSpec(n, n),)) for n in "ab"]
    >>> costs = step_costs(plan(tables, 2), batch_size=4, dense_params=10)
    >>> [(c.stage, c.kind, c.direction, c.max_sent, c.wire) for c in costs.collectives]
    [('ids', 'alltoall', 'fwd', 96, 48), ('vectors', 'alltoall', 'fwd', 256, 128), \
('vectors', 'alltoall', 'bwd', 256, 128), ('dense', 'allreduce', 'bwd', 40, 40)]
    >>> round(predict(costs, Link("toy", alpha_ms=1.0, beta_gbps=1.0)), 6)
    4.000344
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from merlin_models_de.planner.hotness import check_hotness, ids_per_sample
from merlin_models_de.planner.routing import Routing
from merlin_models_de.planner.types import ShardingPlan, ShardingType
from merlin_models_de.tables import FeatureSpec, feature_order

KINDS = ("alltoall", "allgather", "allreduce")
ID_BYTES = 8  # ids, row lengths and the header travel as int64


@dataclass(frozen=True)
class Collective:
    """One collective of a step.

    Attributes:
        stage: The exchange (``ids``, ``values``, ``vectors``, ``sequences``,
            ``rw_<feature>_ids`` / ``_lengths`` / ``_vectors``, ``dense``).
        kind: ``alltoall``, ``allgather`` or ``allreduce``.
        direction: ``fwd`` or ``bwd``.
        sent: Per rank, the bytes it puts in (its whole buffer, the part for itself included).
        received: Per rank, the bytes it gets out (from itself included).
        wire: The most bytes any rank moves over its link in one direction: what leaves
            or enters it for other ranks (all-to-all: its buffer less its own part, which is
            ``(N-1)/N`` of it when every destination gets the same; ring allgather: what the
            others contribute; ring allreduce: ``2(N-1)/N`` of the buffer).
    """

    stage: str
    kind: str
    direction: str
    sent: tuple[int, ...]
    received: tuple[int, ...]
    wire: int

    @property
    def max_sent(self) -> int:
        """Bytes put in by the busiest rank."""
        return max(self.sent)

    @property
    def max_received(self) -> int:
        """Bytes got out by the busiest rank."""
        return max(self.received)


@dataclass(frozen=True)
class StepCosts:
    """The collectives of one step, in the order they run, and their totals.

    Attributes:
        world_size: Ranks.
        batch_size: Samples per rank per step.
        collectives: See :class:`Collective`.
    """

    world_size: int
    batch_size: int
    collectives: tuple[Collective, ...]

    @property
    def count(self) -> int:
        """Collectives per step."""
        return len(self.collectives)

    def sent_per_rank(self) -> tuple[int, ...]:
        """Bytes each rank puts into collectives per step."""
        return tuple(sum(c.sent[r] for c in self.collectives) for r in range(self.world_size))

    def received_per_rank(self) -> tuple[int, ...]:
        """Bytes each rank gets out of collectives per step."""
        return tuple(sum(c.received[r] for c in self.collectives) for r in range(self.world_size))

    @property
    def wire(self) -> int:
        """Sum over collectives of :attr:`Collective.wire`."""
        return sum(c.wire for c in self.collectives)

    def count_by(self, kind: str) -> int:
        """Collectives of one kind per step."""
        return sum(1 for c in self.collectives if c.kind == kind)


@dataclass(frozen=True)
class Link:
    """A latency-bandwidth model of one interconnect: a collective takes
    ``alpha + wire / beta``.

    Attributes:
        name: Name used on the command line.
        alpha_ms: Fixed cost per collective (launch, coordination, latency), ms.
        beta_gbps: Bandwidth per rank and direction, GB/s (10**9 bytes); for NCCL the "bus
            bandwidth" nccl-tests report, which is defined on the same wire bytes.
        allreduce_alpha_ms, allreduce_beta_gbps: Allreduce's own values where they differ
            (None: the same as the others).
        source: Where the numbers come from.

    Example:
        >>> Link("x", 1.0, 2.0).time_ms("alltoall", 2_000_000)
        2.0
    """

    name: str
    alpha_ms: float
    beta_gbps: float
    allreduce_alpha_ms: float | None = None
    allreduce_beta_gbps: float | None = None
    source: str = ""

    def time_ms(self, kind: str, wire: int) -> float:
        """Milliseconds of one collective of ``kind`` moving ``wire`` bytes per rank."""
        if kind not in KINDS:
            raise ValueError(
                f"Unknown collective kind; expected one of {KINDS}. Received: kind={kind!r}"
            )
        alpha, beta = self.alpha_ms, self.beta_gbps
        if kind == "allreduce":
            alpha = alpha if self.allreduce_alpha_ms is None else self.allreduce_alpha_ms
            beta = beta if self.allreduce_beta_gbps is None else self.allreduce_beta_gbps
        return alpha + wire / (beta * 1e9) * 1e3


# Calibrated here by `horovodrun -np 2 python -m merlin_models_de.apps.tools.link_probe`, see
# GLOO_LOOPBACK_NOTE; the NCCL links are rounded from NVIDIA's published figures (README).
GLOO_LOOPBACK_NOTE = (
    "measured 2026-12-01 on this 2-core host: Horovod 0.28.1 + Gloo over "
    "loopback, default HOROVOD_CYCLE_TIME, 2 ranks, float32 all-to-all / "
    "allreduce of 1 KB..4 MB in a tf.function, median of 30 calls, "
    "least-squares fit, mean of 3 runs (other jobs "
    "shared the cores: alpha 1.13-1.45 ms)"
)
LINKS: dict[str, Link] = {
    "gloo-loopback": Link(
        "gloo-loopback",
        alpha_ms=1.28,
        beta_gbps=1.14,
        allreduce_alpha_ms=1.29,
        allreduce_beta_gbps=1.02,
        source=GLOO_LOOPBACK_NOTE,
    ),
    "nvlink-nccl": Link(
        "nvlink-nccl",
        alpha_ms=0.03,
        beta_gbps=230.0,
        source="DGX A100, 8 GPUs on NVSwitch (NVLink 3, 300 GB/s per "
        "direction); NCCL bus bandwidth ~230 GB/s as published "
        "(nccl-tests); NCCL latency only, no Horovod cycle",
    ),
    "infiniband-nccl": Link(
        "infiniband-nccl",
        alpha_ms=0.05,
        beta_gbps=23.0,
        source="multi-node, one HDR 200 Gb/s (25 GB/s) NIC per GPU; "
        "NCCL reaches ~23 GB/s bus bandwidth per NIC; all "
        "off-rank bytes priced at the NIC's rate",
    ),
}


def get_link(name: str) -> Link:
    """The named link. Raises ValueError naming ``name`` and the known links."""
    if name not in LINKS:
        raise ValueError(f"Unknown link; expected one of {sorted(LINKS)}. Received: link={name!r}")
    return LINKS[name]


def collective_ms(collective: Collective, link: Link) -> float:
    """Milliseconds of one collective on ``link``."""
    return link.time_ms(collective.kind, collective.wire)


def predict(costs: StepCosts, link: Link) -> float:
    """Milliseconds per step that the collectives of ``costs`` take on ``link``, one after
    another (nothing overlaps in the backend's step: each exchange reads the previous one)."""
    return sum(collective_ms(c, link) for c in costs.collectives)


def dlrm_dense_params(
    continuous: int,
    embedded: int,
    dim: int,
    bottom_mlp: Sequence[int] = (128,),
    top_mlp: Sequence[int] = (128, 64),
) -> int:
    """Dense parameters of Merlin's ``DLRMModel`` (kernels and biases).

    Bottom MLP ``continuous -> bottom_mlp + [dim]``; the dot interaction of the ``embedded``
    vectors and the bottom output gives ``k(k-1)/2`` pairs (``k = embedded + 1``), which
    Merlin concatenates with the bottom output; top MLP then a 1-unit prediction head.

    Example:
        >>> dlrm_dense_params(13, 26, 16)  # Criteo, dim 16: 237 KB of float32 gradients
        59281
    """

    def mlp(width_in, widths):
        total = 0
        for w in widths:
            total += width_in * w + w
            width_in = w
        return total, width_in

    bottom, _ = mlp(continuous, list(bottom_mlp) + [dim])
    k = embedded + 1
    top, last = mlp(k * (k - 1) // 2 + dim, list(top_mlp))
    return bottom + top + last + 1


def _alltoall(stage, direction, matrix) -> Collective:
    """``matrix[src][dst]`` bytes -> a Collective (wire: off-rank bytes, busiest rank)."""
    n = len(matrix)
    sent = tuple(sum(row) for row in matrix)
    received = tuple(sum(matrix[s][d] for s in range(n)) for d in range(n))
    wire = max(max(sent[r] - matrix[r][r], received[r] - matrix[r][r]) for r in range(n))
    return Collective(stage, "alltoall", direction, sent, received, wire)


def _reverse(c: Collective) -> Collective:
    """The backward all-to-all of ``c``: every rank sends back what it received."""
    return Collective(c.stage, c.kind, "bwd", c.received, c.sent, c.wire)


def _allgather(stage, pieces) -> Collective:
    total = sum(pieces)
    return Collective(
        stage,
        "allgather",
        "fwd",
        tuple(pieces),
        (total,) * len(pieces),
        max(total - p for p in pieces),
    )


def step_costs(
    plan: ShardingPlan,
    batch_size: int,
    *,
    features: Sequence[FeatureSpec] | None = None,
    hotness: float | Mapping[str, float] | None = None,
    dtype_bytes: int = 4,
    dense_params: int = 0,
    allreduce_rounds: int = 1,
    exchange_bytes: int | None = None,
) -> StepCosts:
    """The collectives of one training step of the horovod backend (see the module docstring).

    Args:
        plan: The placement; its world size is N.
        batch_size: Samples per rank per step (B).
        features: The block's ordered features (default: every feature of the plan's
            tables, as the block orders them).
        hotness: Mean ids per sample of multi-hot features: one number for all, or a dict by
            feature name; a feature without one counts what its schema declares, else
            :data:`~merlin_models_de.planner.hotness.DEFAULT_MULTI_HOT`
            (:func:`~merlin_models_de.planner.hotness.ids_per_sample`).
        dtype_bytes: Bytes per embedding / gradient element (4: float32).
        dense_params: Parameters of the rest of the model (allreduced every step).
        allreduce_rounds: Fused allreduce rounds the dense gradients take (Horovod packs
            gradients ready in one cycle into one buffer).
        exchange_bytes: Bytes per element of the model-parallel rows exchanges (the block's
            ``exchange_dtype``: 2 for float16 / bfloat16); None: ``dtype_bytes``.

    Returns:
        A :class:`StepCosts`; no collectives on one rank. Byte counts are rounded down.

    Raises:
        ValueError: naming the option and the value received.
    """
    for name, value, least in (
        ("batch_size", batch_size, 1),
        ("dtype_bytes", dtype_bytes, 1),
        ("dense_params", dense_params, 0),
        ("allreduce_rounds", allreduce_rounds, 1),
        ("exchange_bytes", exchange_bytes or dtype_bytes, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}. Received: {name}={value!r}")
    check_hotness(hotness, feature_order(plan.tables))
    features = tuple(feature_order(plan.tables) if features is None else features)
    n, b, d = plan.world_size, batch_size, dtype_bytes
    x = exchange_bytes or d  # rows of model-parallel tables (row-sliced partials stay d)
    if n == 1:
        return StepCosts(n, b, ())
    routing = Routing.build(plan, features)

    def ids_of(feature) -> int:  # ids per rank per step
        return int(b * ids_per_sample(feature, hotness))

    fwd = []
    # ids: header + one-hot ids + multi-hot row lengths, per owner (the header always goes)
    per_owner = [ID_BYTES * (2 + b * len(routing.served[o])) for o in range(n)]
    fwd.append(_alltoall("ids", "fwd", [per_owner[:] for _ in range(n)]))
    if any(routing.counts(o)[1] for o in range(n)):
        values = [
            sum(ID_BYTES * ids_of(features[l.feature]) for l in routing.served[o] if l.multi_hot)
            for o in range(n)
        ]
        fwd.append(_alltoall("values", "fwd", [values[:] for _ in range(n)]))
    bwd = []
    widths = [routing.width(o) for o in range(n)]
    if sum(widths):
        # owner o sends every rank B x width(o): matrix[o][dst]
        c = _alltoall("vectors", "fwd", [[b * widths[o] * x] * n for o in range(n)])
        fwd.append(c)
        bwd.append(_reverse(c))
    if any(routing.sequences(o) for o in range(n)):
        sequence_rows = [
            sum(ids_of(features[l.feature]) * l.shard.cols for _, l in routing.sequences(o))
            for o in range(n)
        ]
        c = _alltoall("sequences", "fwd", [[sequence_rows[o] * x] * n for o in range(n)])
        fwd.append(c)
        bwd.append(_reverse(c))
    for f in features:
        if plan.kind_of(f.table) is not ShardingType.ROW_WISE:
            continue
        dim = plan.table(f.table).dim
        fwd.append(_allgather(f"rw_{f.name}_ids", [ID_BYTES * ids_of(f)] * n))
        if f.multi_hot:
            fwd.append(_allgather(f"rw_{f.name}_lengths", [ID_BYTES * b] * n))
        # each rank's partial rows for every rank's samples (one row per id when un-pooled)
        rows = ids_of(f) if f.multi_hot and f.combiner is None else b
        c = _alltoall(f"rw_{f.name}_vectors", "fwd", [[rows * dim * d] * n for _ in range(n)])
        fwd.append(c)
        bwd.append(_reverse(c))
    replicated = sum(
        t.elements for t in plan.tables if plan.kind_of(t.name) is ShardingType.DATA_PARALLEL
    )
    reduced = (dense_params + replicated) * d
    dense = []
    if reduced:
        rounds = min(allreduce_rounds, reduced)
        for k in range(rounds):
            size = reduced // rounds + (1 if k < reduced % rounds else 0)
            dense.append(
                Collective(
                    "dense", "allreduce", "bwd", (size,) * n, (size,) * n, 2 * (n - 1) * size // n
                )
            )
    return StepCosts(n, b, tuple(fwd + bwd[::-1] + dense))


def table_lines(costs: StepCosts, links: Sequence[Link] = ()) -> list[str]:
    """A text table: one line per collective (busiest rank's bytes in and out, wire bytes,
    ms per link), then the totals.

    Example:
        >>> print("\\n".join(table_lines(costs, [LINKS["nvlink-nccl"]])))  # doctest: +SKIP
    """
    head = f"{'stage':<16} {'kind':<9} {'dir':<3} {'sent/rank':>11} {'recv/rank':>11} {'wire':>11}"
    lines = [head + "".join(f" {link.name + ' ms':>20}" for link in links)]
    for c in costs.collectives:
        lines.append(
            f"{c.stage:<16} {c.kind:<9} {c.direction:<3} {c.max_sent:>11,} "
            f"{c.max_received:>11,} {c.wire:>11,}"
            + "".join(f" {collective_ms(c, link):>20.3f}" for link in links)
        )
    kinds = ", ".join(f"{costs.count_by(k)} {k}" for k in KINDS if costs.count_by(k))
    lines.append(
        f"{'total':<16} {costs.count:<9} {'':<3} {max(costs.sent_per_rank(), default=0):>11,} "
        f"{max(costs.received_per_rank(), default=0):>11,} {costs.wire:>11,}"
        + "".join(f" {predict(costs, link):>20.3f}" for link in links)
    )
    lines.append(f"{costs.count} collectives per step ({kinds or 'none'})")
    return lines
