"""Next-item training command: ``horovodrun -np N python -m merlin_models_de.apps.next_item``.

Trains a session model on synthetic sessions (``--sessions`` per epoch over a catalog of
``--items``, Zipf-like popularity; every rank makes only its own sessions, the same set
whatever the world size): the item-id sequence through ``mm.InputBlockV2`` with
``mm.DistributedEmbeddings(sequence_combiner=None)``, a GRU (``--encoder gru``) or Merlin's
``mm.GPT2Block`` (``--encoder transformer``, needs ``transformers``), an MLP to ``--dim`` and
Merlin's ``mm.CategoricalOutput(to_call=block["item_id"])``, weight-tied to the item table,
trained with ``mm.SequencePredictLast`` (each session's last item is the target). By default
the item table is row-sliced over the ranks, so the softmax is vocab-parallel and no rank
holds the whole table or the ``[batch, catalog]`` logits. ``--embeddings merlin`` is the
baseline: ``mm.Embeddings`` (data parallel, the full softmax on every rank).

Rank 0 prints the placement and, after each epoch, the global samples/s, the loss, evaluate's
recall@10 and NDCG@10 on held-out sessions, and every rank's embedding bytes and peak
resident memory; a JSON report goes to ``--report``.

Examples:
    horovodrun -np 2 -H localhost:2 python -m merlin_models_de.apps.next_item --epochs 2
    horovodrun -np 2 -H localhost:2 merlin-models-de-next-item --embeddings merlin --items 200000

Options are checked before TensorFlow loads; a bad one exits with status 2 and one line
(under horovodrun every rank exits 2 and rank 0 prints the line).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time

from merlin_models_de.apps.defaults import OPTIMIZERS
from merlin_models_de.apps.dlrm import (EMBEDDINGS, _OneLineParser, _ints, checked_arguments,
                                      world)
from merlin_models_de.backends.registry import BACKEND_NAMES, is_installed
from merlin_models_de.planner import STRATEGIES, validate_options

STARTED = time.perf_counter()
ENCODERS = ("gru", "transformer")


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    ap = _OneLineParser(prog="python -m merlin_models_de.apps.next_item", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    data = ap.add_argument_group("data")
    data.add_argument("--items", type=int, default=1_000_000, help="catalog size (table rows)")
    data.add_argument("--max-length", type=int, default=20, help="longest session (items)")
    data.add_argument("--sessions", type=int, default=4096, help="training sessions per epoch")
    data.add_argument("--valid-sessions", type=int, default=None,
                      help="held-out sessions evaluated after each epoch (default: sessions / "
                           "10, at least one global batch; 0: none)")
    data.add_argument("--seed", type=int, default=0, help="seed of the data and initial weights")
    model = ap.add_argument_group("model and training")
    model.add_argument("--dim", type=int, default=64, help="item embedding width")
    model.add_argument("--encoder", default="gru", choices=ENCODERS)
    model.add_argument("--hidden", type=int, default=None,
                       help="GRU units / transformer width (default: --dim)")
    model.add_argument("--layers", type=int, default=2, help="transformer layers")
    model.add_argument("--heads", type=int, default=2, help="transformer attention heads")
    model.add_argument("--mlp", type=_ints, default=[128],
                       help="hidden widths of the MLP after the encoder (dim is appended)")
    model.add_argument("--batch-size", type=int, default=512, help="sessions per rank per step")
    model.add_argument("--epochs", type=int, default=2)
    model.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    model.add_argument("--learning-rate", type=float, default=None,
                       help="per-rank rate (Merlin multiplies it by the world size)")
    place = ap.add_argument_group("placement")
    place.add_argument("--embeddings", default="distributed", choices=EMBEDDINGS)
    place.add_argument("--strategy", default="memory_optimized", choices=STRATEGIES)
    place.add_argument("--row-slice-threshold", type=int, default=None,
                       help="elements from which a table is row-sliced (default: the item "
                            "table is row-sliced on more than one rank)")
    place.add_argument("--column-slice-threshold", type=int, default=None)
    place.add_argument("--data-parallel-threshold", type=int, default=None)
    place.add_argument("--backend", default="auto", choices=BACKEND_NAMES)
    place.add_argument("--no-validate-ids", dest="validate_ids", action="store_false")
    out = ap.add_argument_group("output")
    out.add_argument("--report", default=None, help="JSON run report path")
    out.add_argument("--cpu-threads", type=int, default=None,
                     help="TF threads per rank (default: cores / ranks on this host)")
    out.add_argument("--quiet", action="store_true", help="no Keras progress bar")
    return ap


def row_slice_threshold(args, size: int) -> int | None:
    """The block's ``row_slice_threshold``: the option, else the item table's elements on
    more than one rank (the table row-sliced), else None."""
    if args.row_slice_threshold is not None:
        return args.row_slice_threshold
    return args.items * args.dim if size > 1 else None


def check_options(args) -> str | None:
    """The first problem with the options themselves, or None; the same on every rank."""
    size = world()[0]
    for name in ("sessions", "batch_size", "epochs", "dim", "layers", "heads"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be >= 1. Received: {flag}={getattr(args, name)}"
    if args.items < 3:
        return f"--items must be >= 3 (id 0 is padding). Received: --items={args.items}"
    if args.max_length < 2:
        return f"--max-length must be >= 2. Received: --max-length={args.max_length}"
    for name, least in (("valid_sessions", 0), ("hidden", 1), ("cpu_threads", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be >= {least}. Received: {flag}={value}"
    lr = args.learning_rate
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        return f"--learning-rate must be a finite number > 0. Received: --learning-rate={lr}"
    if args.sessions < args.batch_size * size:
        return (f"--sessions must hold at least one global batch (batch size {args.batch_size} "
                f"x {size} ranks). Received: --sessions={args.sessions}")
    valid = args.valid_sessions
    if valid and valid < args.batch_size * size:
        return (f"--valid-sessions must be 0 or hold at least one global batch (batch size "
                f"{args.batch_size} x {size} ranks). Received: --valid-sessions={valid}")
    if args.encoder == "transformer" and (args.hidden or args.dim) % args.heads:
        return (f"--heads must divide the transformer width {args.hidden or args.dim}. "
                f"Received: --heads={args.heads}")
    try:
        validate_options(size, args.strategy, args.column_slice_threshold,
                         row_slice_threshold(args, size), args.data_parallel_threshold)
    except ValueError as err:
        return str(err)
    return None


def check_host(args) -> str | None:
    """The first problem this host has with the options (installed packages), or None."""
    if args.backend != "auto" and not is_installed(args.backend):
        return ("--backend distributed-embeddings needs NVIDIA distributed-embeddings "
                "(scripts/install_distributed_embeddings.sh). Received: "
                "--backend=distributed-embeddings")
    if args.encoder == "transformer" and importlib.util.find_spec("transformers") is None:
        return ("--encoder transformer needs the transformers package (pip install "
                "transformers==4.33.3). Received: --encoder=transformer")
    return None


def main(argv=None) -> int:
    """Entry point (console script ``merlin-models-de-next-item``); returns the exit code."""
    args = checked_arguments(parser(), argv, check_options, check_host)
    if args is None:
        return 2  # every rank: horovodrun then stops the job with a non-zero status
    args.row_slice_threshold = row_slice_threshold(args, world()[0])  # the run's, resolved
    from merlin_models_de.apps.next_item_run import run

    report = run(args, STARTED)
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main())
