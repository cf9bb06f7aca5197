"""Per-epoch numbers of a DLRM run: speed, loss, validation metrics, per-rank memory."""

from __future__ import annotations

import os
import statistics
import time

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.apps.common.dynamic import counters_text
from merlin_models_de.apps.common.options import LOCAL_TABLES
from merlin_models_de.apps.common.reports import (
    cpu_seconds,
    embedding_bytes,
    host_cpu_ticks,
    huge_page_bytes,
    peak_rss_bytes,
)
from merlin_models_de.tables import human_bytes


class EpochReport(tf.keras.callbacks.Callback):
    """Times epochs (training steps only, validation apart) and gathers every rank's memory.

    Collective at each epoch end (every rank must use it). Rank 0 prints one line per epoch.
    """

    def __init__(
        self, args, block, steps: int, threads: int, started: float, phases=None, resumed=None
    ):
        super().__init__()
        self.phases = dict(phases or {})  # seconds since start at which each phase ended
        self.args, self.block, self.steps, self.threads = args, block, steps, threads
        self.started, self.first_step, self.epochs = started, None, []
        self.resumed = resumed  # where a resumed run started (checkpoint, step, skipped)
        self._batches = 0  # this epoch's: a resumed epoch runs only its remaining batches
        self.global_batch = args.batch_size * comm.size()
        self._t0 = self._last = None
        self._cpu0 = self._cpu_last = None  # cpu_seconds() at the epoch's start / last batch
        self._host0 = self._host_last = None  # host_cpu_ticks() at the same points
        self.warm_steps = []  # seconds of each step after the first epoch (batch end to end)
        self._supports_tf_logs = True  # logs are read once per epoch: no per-step numpy copy

    def placement(self) -> str:
        """The block's placement summary (or what data parallel means for mm.Embeddings)."""
        if hasattr(self.block, "summary") and hasattr(self.block, "plan"):
            return self.block.summary(optimizer=self.args.optimizer)
        how = (
            "local tables (a speed bound, not a valid training: only dense gradients are "
            "averaged)"
            if self.args.embeddings == LOCAL_TABLES
            else "data parallel"
        )
        return (
            f"mm.Embeddings, {how}: each of {comm.size()} ranks holds every table "
            f"({human_bytes(embedding_bytes(self.block))})"
        )

    def on_train_begin(self, logs=None):
        self.phases.setdefault("fit_started", time.perf_counter() - self.started)

    def on_train_batch_begin(self, batch, logs=None):
        self.phases.setdefault("first_step_started", time.perf_counter() - self.started)

    def on_epoch_begin(self, epoch, logs=None):
        self._t0, self._batches = time.perf_counter(), 0
        self._cpu0, self._host0 = cpu_seconds(), host_cpu_ticks()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        # with steps_per_execution > 1 Keras calls this once per execution, ``batch`` being
        # its last step: each of its steps gets an equal share of its time
        steps = max(1, batch + 1 - self._batches)
        if self.epochs:  # warm: the first epoch traces and initializes
            took = now - (self._t0 if self._batches == 0 else self._last)
            self.warm_steps += [took / steps] * steps
        self._last, self._cpu_last, self._host_last = now, cpu_seconds(), host_cpu_ticks()
        self._batches += steps
        if self.first_step is None:
            self.first_step = self.phases["first_step"] = self._last - self.started

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        seconds = self._last - self._t0
        # training's CPU (validation apart): where a host's cores went, by every thread
        cpu = [b - a for a, b in zip(self._cpu0, self._cpu_last or self._cpu0)]
        host = (
            None
            if self._host0 is None or self._host_last is None
            else [b - a for a, b in zip(self._host0, self._host_last)]
        )
        mine = {
            "embedding_bytes": embedding_bytes(self.block),
            "peak_rss_bytes": peak_rss_bytes(),
            "huge_page_bytes": huge_page_bytes(),
            "loss": float(logs.get("loss", float("nan"))),
            "cpu_seconds": cpu,
            "host_cpu_ticks": host,
        }
        ranks = comm.allgather_object(mine, name=f"mmde_report_epoch{epoch}")
        # dynamic tables: keys holding a row, admitted and evicted so far (collective)
        counters = self.block.dynamic_counters() if hasattr(self.block, "dynamic_counters") else {}
        entry = {
            "epoch": epoch + 1,
            "steps": self._batches,
            "train_seconds": seconds,
            "samples_per_second": self._batches * self.global_batch / seconds,
            "loss": sum(r["loss"] for r in ranks) / len(ranks),
            "val_auc": _get(logs, "val_auc"),
            "val_logloss": _get(logs, "val_logloss"),
            "embedding_bytes": [r["embedding_bytes"] for r in ranks],
            "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
            # per rank, on 2 MB pages at the epoch's end (apps/common/huge_pages.py)
            "huge_page_bytes": [r["huge_page_bytes"] for r in ranks],
            "cpu_seconds": [r["cpu_seconds"] for r in ranks],  # per rank: user, system
            # per rank, of its host: (stolen, all) ticks while this epoch trained
            "host_cpu_ticks": [r["host_cpu_ticks"] for r in ranks],
        }
        if counters:
            entry["dynamic_tables"] = counters
        self.epochs.append(entry)
        if comm.rank() == 0:
            print(_line(entry, self.steps), flush=True)

    def finish(self) -> dict:
        """The run report (JSON-ready)."""
        warm = self.epochs[1:]
        warm_sps = (
            (
                sum(e["steps"] for e in warm)
                * self.global_batch
                / sum(e["train_seconds"] for e in warm)
            )
            if warm
            else None
        )
        samples = sum(e["steps"] for e in warm) * self.global_batch
        # CPU seconds per 1,000 samples over the warm epochs, every rank summed
        warm_cpu = (
            {
                kind: 1000 * sum(r[i] for e in warm for r in e["cpu_seconds"]) / samples
                for i, kind in enumerate(("user", "system"))
            }
            if warm
            else None
        )
        plan = getattr(self.block, "plan", None)
        return {
            "command": "merlin_models_de.apps.dlrm",
            "options": vars(self.args),
            "world_size": comm.size(),
            "cpu_threads": self.threads,
            # what Horovod started with (None: its own, 1 ms or tuned; apps/common/cores.py)
            "horovod_cycle_time_ms": _cycle_time_ms() if comm.hvd() else None,
            "backend": getattr(self.block, "backend_name", "mm.Embeddings"),
            "steps_per_epoch": self.steps,
            "global_batch": self.global_batch,
            "resumed": self.resumed,
            "time_to_first_step": self.first_step,
            "phases": self.phases,
            "first_epoch_samples_per_second": self.epochs[0]["samples_per_second"]
            if self.epochs
            else None,
            "warm_samples_per_second": warm_sps,
            "warm_cpu_per_1000_samples": warm_cpu,
            "warm_host_steal_share": steal_share(warm),
            # per step (a step's first batch counts from its epoch's start): the median
            # is the steady step, the mean adds each epoch's start
            "warm_step_seconds": _spread(self.warm_steps),
            "warm_step_times": [round(t, 6) for t in self.warm_steps],  # finds stalls
            "total_embedding_bytes": sum(t.rows * t.dim * 4 for t in self.block.tables)
            if plan is not None
            else embedding_bytes(self.block),
            "epochs": self.epochs,
            "plan": plan.to_dict() if plan is not None else None,
        }


def steal_share(epochs: list) -> float | None:
    """The largest share of a host's CPU time stolen by its hypervisor while ``epochs``
    trained, over the ranks' hosts (None where a host does not say).

    Example:
        >>> steal_share([{"host_cpu_ticks": [[1, 100], [0, 100]]},
        ...              {"host_cpu_ticks": [[9, 100], [0, 100]]}])
        0.05
    """
    per_rank = [e["host_cpu_ticks"] for e in epochs]
    if not per_rank or any(t is None for ranks in per_rank for t in ranks):
        return None
    shares = []
    for rank in range(len(per_rank[0])):
        stolen = sum(ranks[rank][0] for ranks in per_rank)
        total = sum(ranks[rank][1] for ranks in per_rank)
        shares.append(stolen / total if total else 0.0)
    return max(shares)


def _cycle_time_ms() -> float | None:
    """The ``HOROVOD_CYCLE_TIME`` Horovod started with, or None (its own)."""
    value = os.environ.get("HOROVOD_CYCLE_TIME")
    try:
        return float(value) if value else None
    except ValueError:  # Horovod reads what strtof makes of it; the report says nothing
        return None


def _spread(seconds: list) -> dict | None:
    """Median, mean, min, max and 90th percentile of ``seconds`` (None when empty)."""
    if not seconds:
        return None
    ordered = sorted(seconds)
    return {
        "median": statistics.median(ordered),
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "steps": len(ordered),
    }


def _get(logs, key):
    value = logs.get(key)
    return None if value is None else float(value)


def _line(e, steps: int) -> str:
    mem = " ".join(
        f"r{i}={human_bytes(b)}/{human_bytes(r)}"
        for i, (b, r) in enumerate(zip(e["embedding_bytes"], e["peak_rss_bytes"]))
    )
    val = (
        ""
        if e["val_auc"] is None
        else f" val_auc={e['val_auc']:.4f} val_logloss={e['val_logloss']:.4f}"
    )
    part = "" if e["steps"] == steps else f" ({e['steps']} of {steps} steps: resumed)"
    dynamic = counters_text(e.get("dynamic_tables", {}))
    return (
        f"epoch {e['epoch']}{part}: {e['samples_per_second']:,.0f} samples/s "
        f"({e['train_seconds']:.2f} s) loss={e['loss']:.4f}{val} "
        f"embeddings/peak RSS per rank: {mem}{dynamic}"
    )
