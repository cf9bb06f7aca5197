"""Which collective carries what in one training step, in which order: the step schedule.

Plain data, built once per plan (:meth:`StepSchedule.build`): the stages of one call of the
block, in order, each with the collectives it issues. :class:`.pipeline.StepPipeline` runs a
call by walking them (one stage function per kind); docs/design.md prints the schedule as a
table (:meth:`StepSchedule.table`); tests compare it, in order, with the collectives a traced
``fit``, ``evaluate`` and ``predict`` step holds.

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
# the optimizer's round: merged with the rows' backward, or the grouped average of the dense
# gradients (comm.average_gradients); Merlin's MultiOptimizer names its own (merlin/optimizers)
MERGED, MULTI_MERGED = "mmde_merged", "mmde_grad_multi_merged"
DENSE, MULTI_DENSE = "mmde_grad_float32", "mmde_grad_multi_float32"


# the stages only a training step that sends the next batch's ids runs (``for_call``)
AHEAD_ONLY = ("next_ids", "ids_next", "keep")


@dataclass(frozen=True)
class Collective:
    """One collective of a step."""

    name: str  # the collective's name after the block's prefix
    op: str  # alltoall, allgather
    payload: str  # what it carries
    when: str  # which steps run it
    direction: str  # forward, or backward (gradients)
    feature: str | None = None  # the feature a row-sliced table's collective serves


@dataclass(frozen=True)
class Stage:
    """One stage of a call: its kind (a key of ``pipeline.STAGES``), the collectives it issues
    in order (none: it works locally), and the feature a row-sliced stage looks up."""

    kind: str
    collectives: tuple[Collective, ...] = ()
    feature: int | None = None


@dataclass(frozen=True)
class StepSchedule:
    """The stages of one call of a block on several ranks, and their collectives."""

    stages: tuple[Stage, ...]  # of a training step that sends the next batch's ids, in order
    backward: tuple[Collective, ...]  # the plain backward (no optimizer waiting for it)

    @classmethod
    def build(cls, routing: Routing, features) -> "StepSchedule":
        """The schedule of ``routing`` (the plan's who-serves-what) for ``features``."""
        n = routing.world_size
        rows = any(routing.width(j) for j in range(n))
        multi_hot = any(routing.counts(j)[1] for j in range(n))
        sequences = any(routing.sequences(j) for j in range(n))
        ids = Collective(
            "ids",
            "alltoall",
            "header (batch, problems), one-hot ids, multi-hot row lengths",
            NOTHING_KEPT,
            "forward",
        )
        stages = [Stage("ids", (ids,)), Stage("next_ids"), Stage("unpack")]
        backward = []
        if multi_hot:
            stages.append(
                Stage(
                    "values",
                    (Collective("values", "alltoall", "multi-hot ids", EVERY_STEP, "forward"),),
                )
            )
        stages.append(Stage("lookup"))
        if rows:
            stages.append(
                Stage(
                    "vectors",
                    (
                        Collective(
                            "vectors",
                            "alltoall",
                            "pooled rows, then the next batch's ids",
                            EVERY_STEP,
                            "forward",
                        ),
                    ),
                )
            )
            backward.append(
                Collective(
                    "vectors_grad", "alltoall", "pooled rows' gradients", EVERY_STEP, "backward"
                )
            )
        if sequences:
            stages.append(
                Stage(
                    "sequences",
                    (Collective("sequences", "alltoall", "un-pooled rows", EVERY_STEP, "forward"),),
                )
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
            issued = [
                Collective(
                    f"{stage}_ids", "allgather", f"'{f.name}' ids", EVERY_STEP, "forward", f.name
                )
            ]
            if f.multi_hot:
                issued.append(
                    Collective(
                        f"{stage}_lengths",
                        "allgather",
                        f"'{f.name}' row lengths",
                        EVERY_STEP,
                        "forward",
                        f.name,
                    )
                )
            issued.append(
                Collective(
                    f"{stage}_rows",
                    "alltoall",
                    f"'{f.name}' partial rows",
                    EVERY_STEP,
                    "forward",
                    f.name,
                )
            )
            stages.append(Stage("row_sliced", tuple(issued), feature=i))
            backward.append(
                Collective(
                    f"{stage}_rows_grad",
                    "alltoall",
                    f"'{f.name}' partial rows' gradients",
                    EVERY_STEP,
                    "backward",
                    f.name,
                )
            )
        if not rows:  # no rows' exchange to carry them: the next ids go alone
            stages.append(
                Stage(
                    "ids_next",
                    (
                        Collective(
                            "ids_next",
                            "alltoall",
                            "the next batch's ids",
                            "when the input brings the next batch",
                            "forward",
                        ),
                    ),
                )
            )
        stages += [Stage("assemble"), Stage("keep")]
        return cls(tuple(stages), tuple(backward))

    def for_call(self, ahead: bool) -> tuple[Stage, ...]:
        """The stages of one call: ``ahead``, a training step that sends the next batch's ids
        (its ids come from the step before, or are exchanged when nothing was kept: the
        ``kept_or_ids`` stage); else the ids are exchanged first, nothing is sent ahead."""
        if ahead:
            return tuple(
                Stage("kept_or_ids", s.collectives) if s.kind == "ids" else s for s in self.stages
            )
        return tuple(s for s in self.stages if s.kind not in AHEAD_ONLY)

    def forward(self, ahead: bool) -> tuple[Collective, ...]:
        """The forward collectives of a call (see :meth:`for_call`), in order."""
        return tuple(c for s in self.for_call(ahead) for c in s.collectives)

    def in_fit(
        self, next_batch: bool, merged: bool, read_order=None, multi_optimizer: bool = False
    ) -> tuple[Collective, ...]:
        """The collectives a traced ``fit`` step of the block holds, in the order the trace
        makes them: ``next_batch``, its input brings the next batch (``tf.data``);
        ``merged``, the pooled rows' backward waits for the optimizer (``merge_backward``),
        which sends it with the dense average; ``multi_optimizer``, the model's optimizer is
        Merlin's ``MultiOptimizer`` (which names the optimizer's round its own way).

        The tape computes the row-sliced tables' gradients in the order the model reads the
        block's outputs (Merlin concatenates them by feature name): ``read_order``, feature
        names in that order (None: the block's order)."""
        forward = list(self.forward(next_batch))
        backward = [c for c in self.backward if not merged or c.name != "vectors_grad"]
        if read_order is not None:
            rank = {name: k for k, name in enumerate(read_order)}
            plain = [c for c in backward if c.feature is None]
            sliced = sorted(
                (c for c in backward if c.feature is not None), key=lambda c: rank[c.feature]
            )
            backward = plain + sliced
        if merged and any(c.name == "vectors" for c in forward):
            backward.append(
                Collective(
                    MULTI_MERGED if multi_optimizer else MERGED,
                    "alltoall",
                    "pooled rows' gradients, then this rank's dense gradients (float32)",
                    EVERY_STEP,
                    "backward",
                )
            )
        else:
            backward.append(
                Collective(
                    MULTI_DENSE if multi_optimizer else DENSE,
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
