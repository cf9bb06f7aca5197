"""Which collective carries what in one training step, in which order: the step schedule.

Plain data, built once per plan (:meth:`StepSchedule.build`). The backend reads the one choice
it makes (:attr:`StepSchedule.next_ids_ride`: the next batch's ids ride in the rows' forward
all-to-all, or go alone), docs/design.md prints it as a table (:meth:`StepSchedule.table`),
and a test compares it with the collectives a traced ``fit`` step holds.

Collective names: every rank names a collective ``<block prefix>_<name>`` (the block's name
and tables, ``EmbeddingBackend.collective_name``), so two blocks of a model never pair up;
the backward of a plain all-to-all is ``<name>_grad``. The optimizer's merged round is
``mmde_merged`` (Merlin's ``MultiOptimizer``: ``mmde_grad_multi_merged``); what it does not
carry (gradients of other dtypes, or a dense part past ``backward.MAX_EXTRA_BYTES`` of extra
bytes) goes in the grouped allreduce ``mmde_grad_<dtype>``.

Example:
    >>> from merlin_models_de.planner import plan as make_plan  # doctest: +SKIP
    >>> print(StepSchedule.build(Routing.build(plan, features), features).table())  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from merlin_models_de.planner.routing import Routing
from merlin_models_de.planner.types import ShardingType

EVERY_STEP = "every step"
NOTHING_KEPT = "when nothing was sent ahead (a fit's first step, evaluate, predict)"
MERGED = "mmde_merged"
DENSE = "mmde_grad_float32"  # the optimizer's grouped average (comm.average_gradients)


@dataclass(frozen=True)
class Collective:
    """One collective of a step."""

    name: str  # the collective's name after the block's prefix
    op: str  # alltoall, allgather
    payload: str  # what it carries
    when: str  # which steps run it
    direction: str  # forward, or backward (gradients)


@dataclass(frozen=True)
class StepSchedule:
    """The collectives of one training step of a block on several ranks."""

    forward: tuple[Collective, ...]  # in the order every rank starts them
    backward: tuple[Collective, ...]  # the plain backward (no optimizer waiting for it)
    next_ids_ride: bool  # the next batch's ids ride in the rows' forward exchange

    @classmethod
    def build(cls, routing: Routing, features) -> "StepSchedule":
        """The schedule of ``routing`` (the plan's who-serves-what) for ``features``."""
        n = routing.world_size
        rows = any(routing.width(j) for j in range(n))
        multi_hot = any(routing.counts(j)[1] for j in range(n))
        sequences = any(routing.sequences(j) for j in range(n))
        forward = [
            Collective(
                "ids",
                "alltoall",
                "header (batch, problems), one-hot ids, multi-hot row lengths",
                NOTHING_KEPT,
                "forward",
            )
        ]
        backward = []
        if multi_hot:
            forward.append(Collective("values", "alltoall", "multi-hot ids", EVERY_STEP, "forward"))
        if rows:
            forward.append(
                Collective(
                    "vectors",
                    "alltoall",
                    "pooled rows, then the next batch's ids",
                    EVERY_STEP,
                    "forward",
                )
            )
            backward.append(
                Collective(
                    "vectors_grad", "alltoall", "pooled rows' gradients", EVERY_STEP, "backward"
                )
            )
        if sequences:
            forward.append(
                Collective("sequences", "alltoall", "un-pooled rows", EVERY_STEP, "forward")
            )
            backward.append(
                Collective(
                    "sequences_grad",
                    "alltoall",
                    "un-pooled rows' gradients",
                    EVERY_STEP,
                    "backward",
                )
            )
        for i, f in enumerate(features):
            if not any(p.kind is ShardingType.ROW_WISE for p in routing.pieces[i]):
                continue
            stage = f"rw_{f.name}"
            forward.append(
                Collective(f"{stage}_ids", "allgather", f"'{f.name}' ids", EVERY_STEP, "forward")
            )
            if f.multi_hot:
                forward.append(
                    Collective(
                        f"{stage}_lengths",
                        "allgather",
                        f"'{f.name}' row lengths",
                        EVERY_STEP,
                        "forward",
                    )
                )
            forward.append(
                Collective(
                    f"{stage}_rows", "alltoall", f"'{f.name}' partial rows", EVERY_STEP, "forward"
                )
            )
            backward.append(
                Collective(
                    f"{stage}_rows_grad",
                    "alltoall",
                    f"'{f.name}' partial rows' gradients",
                    EVERY_STEP,
                    "backward",
                )
            )
        if not rows:
            forward.append(
                Collective(
                    "ids_next",
                    "alltoall",
                    "the next batch's ids",
                    "when the input brings the next batch",
                    "forward",
                )
            )
        return cls(tuple(forward), tuple(backward), next_ids_ride=rows)

    def in_fit(self, next_batch: bool, merged: bool) -> tuple[Collective, ...]:
        """The collectives a traced ``fit`` step of the block holds: ``next_batch``, its input
        brings the next batch (``tf.data``); ``merged``, the pooled rows' backward waits for
        the optimizer (``merge_backward``), which sends it with the dense average."""
        forward = [c for c in self.forward if next_batch or c.name != "ids_next"]
        backward = [c for c in self.backward if not merged or c.name != "vectors_grad"]
        if merged and any(c.name == "vectors" for c in forward):
            backward.append(
                Collective(
                    MERGED,
                    "alltoall",
                    "pooled rows' gradients, then this rank's dense gradients (float32)",
                    EVERY_STEP,
                    "backward",
                )
            )
        else:
            backward.append(
                Collective(
                    DENSE,
                    "grouped allreduce",
                    "dense gradients (one group per dtype)",
                    EVERY_STEP,
                    "backward",
                )
            )
        return tuple(forward + backward)

    def table(self, next_batch: bool = True, merged: bool = True) -> str:
        """:meth:`in_fit` as a Markdown table."""
        lines = [
            "| collective | op | payload | when | direction |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| `{c.name}` | {c.op} | {c.payload} | {c.when} | {c.direction} |"
            for c in self.in_fit(next_batch, merged)
        ]
        return "\n".join(lines)
