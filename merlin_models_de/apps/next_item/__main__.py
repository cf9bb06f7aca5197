"""Next-item training command: ``horovodrun -np N python -m merlin_models_de.apps.next_item``.

Trains a session model on synthetic sessions (``--sessions`` per epoch over a catalog of
``--items``, Zipf-like popularity; every rank makes only its own sessions, the same set
whatever the world size) or on parquet sessions (``--train-dir`` and ``--valid-dir``, each a
directory with a Merlin schema; every rank reads its own partitions with Merlin's Loader;
the item sequence is the schema's one list column tagged ITEM and ID, the catalog its
domain max + 1): the item-id sequence through ``mm.InputBlockV2`` with
``mm.DistributedEmbeddings(sequence_combiner=None)``, a GRU (``--encoder gru``) or Merlin's
``mm.GPT2Block`` (``--encoder transformer``, needs ``transformers``), an MLP to ``--dim`` and
an output weight-tied to the item table, trained with ``mm.SequencePredictLast`` (each
session's last item is the target). ``--loss softmax`` (default): Merlin's
``mm.CategoricalOutput(to_call=block[item])``; by default the item table is row-sliced over
the ranks, so the softmax is vocab-parallel and no rank holds the whole table or the
``[batch, catalog]`` logits. ``--loss sampled``: ``mm.ContrastiveOutput`` with every rank's
in-batch positives as negatives (``GlobalInBatchSampler``). ``--embeddings merlin`` is the
baseline: ``mm.Embeddings`` (data parallel, the full softmax on every rank).

Rank 0 prints the placement and, after each epoch, the global samples/s, the loss, evaluate's
recall@10 and NDCG@10 on held-out sessions over the whole catalog (with ``--loss sampled`` a
twin of the model with the softmax output evaluates; ``val_sampled_*`` is the sampled
output's own evaluate, the target ranked among the global batch's items), and every rank's
embedding bytes and peak resident memory; a JSON report goes to ``--report``.
``--checkpoint-dir`` saves each epoch (and every ``--checkpoint-every`` steps); a run started
with a checkpoint there resumes from it (as the DLRM command does, mid-epoch included).
``--elastic`` (with ``--checkpoint-dir`` and ``--checkpoint-every``) trains under Horovod
elastic as the DLRM command does: a lost host costs the steps since the last commit.
``--categories N`` adds each item's category as a second sequence feature (synthetic sessions).
``--dynamic FEATURE[=CAPACITY]`` with ``--admit-after``, ``--evict``, ``--ttl`` (as the DLRM
command takes them: docs/dynamic.md) makes that feature's table dynamic, and each epoch's line
and the report count its keys; the item column cannot be dynamic (the output is tied to its
table and looks rows up by row id), which the command refuses naming it.

Examples:
    horovodrun -np 2 -H localhost:2 python -m merlin_models_de.apps.next_item --epochs 2
    horovodrun -np 2 -H localhost:2 mmde-next-item --embeddings merlin --items 200000
    horovodrun -np 4 -H a:2,b:2 mmde-next-item --train-dir /data/train \\
        --valid-dir /data/valid --loss sampled --checkpoint-dir /ckpt

Options are checked before TensorFlow loads; a bad one exits with status 2 and one line
(under horovodrun every rank exits 2 and rank 0 prints the line). A dataset whose schema has
no single item-id list column, or no domain for it, exits the same way (after TensorFlow
loads: Merlin's schema reader needs it).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time

from merlin_models_de.apps.common.dynamic import add_dynamic_options, dynamic_problem
from merlin_models_de.apps.common.optimizers import OPTIMIZERS, add_learning_rate
from merlin_models_de.apps.common.options import (
    EMBEDDINGS,
    OneLineParser,
    add_run_options,
    checked_arguments,
    dataset_dir_problem,
    elastic_problem,
    ints,
    memory_problem,
    parquet_files_problem,
    report_problem,
    world,
)
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.apps.common.row_hashing import add_hashing_option, row_hashing_problem
from merlin_models_de.apps.next_item.data import CATEGORY, ITEM, row_slice_threshold
from merlin_models_de.backends.registry import BACKEND_NAMES, is_installed
from merlin_models_de.planner import OPTIMIZER_SLOTS, STRATEGIES, validate_options

STARTED = time.perf_counter()
ENCODERS = ("gru", "transformer")
LOSSES = ("softmax", "sampled")
# synthetic-data options: None in the parser, so that giving one with --train-dir is an error
DEFAULTS = {"items": 1_000_000, "max_length": 20, "sessions": 4096, "categories": 0}


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    ap = OneLineParser(
        prog=program_name("merlin_models_de.apps.next_item"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = ap.add_argument_group("data (synthetic sessions, or parquet with --train-dir)")
    data.add_argument(
        "--items",
        type=int,
        default=None,
        help=f"catalog size (table rows; default {DEFAULTS['items']:,})",
    )
    data.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"longest session (items; default {DEFAULTS['max_length']})",
    )
    data.add_argument(
        "--sessions",
        type=int,
        default=None,
        help=f"training sessions per epoch (default {DEFAULTS['sessions']})",
    )
    data.add_argument(
        "--valid-sessions",
        type=int,
        default=None,
        help="held-out sessions evaluated after each epoch (default: sessions / "
        "10, at least one global batch; 0: none)",
    )
    data.add_argument(
        "--categories",
        type=int,
        default=None,
        help="also a category sequence beside the items (each item's category, a fixed "
        "function of its id; a table of this many rows); default 0: none",
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the data and initial weights")
    data.add_argument(
        "--train-dir",
        default=None,
        help="parquet sessions + Merlin schema: one item-id list column (tags "
        "ITEM, ID), catalog = its domain max + 1; needs --valid-dir",
    )
    data.add_argument(
        "--valid-dir", default=None, help="held-out parquet sessions evaluated after each epoch"
    )
    add_hashing_option(data)
    model = ap.add_argument_group("model and training")
    model.add_argument("--dim", type=int, default=64, help="item embedding width")
    model.add_argument("--encoder", default="gru", choices=ENCODERS)
    model.add_argument(
        "--hidden", type=int, default=None, help="GRU units / transformer width (default: --dim)"
    )
    model.add_argument("--layers", type=int, default=2, help="transformer layers")
    model.add_argument("--heads", type=int, default=2, help="transformer attention heads")
    model.add_argument(
        "--mlp",
        type=ints,
        default=[128],
        help="hidden widths of the MLP after the encoder (dim is appended)",
    )
    model.add_argument("--batch-size", type=int, default=512, help="sessions per rank per step")
    model.add_argument("--epochs", type=int, default=2)
    model.add_argument(
        "--loss",
        default="softmax",
        choices=LOSSES,
        help="softmax: full catalog (vocab-parallel on a sharded table); "
        "sampled: ContrastiveOutput, in-batch negatives of all ranks",
    )
    model.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    add_learning_rate(model)
    place = ap.add_argument_group("placement")
    place.add_argument("--embeddings", default="distributed", choices=EMBEDDINGS)
    place.add_argument("--strategy", default="memory_optimized", choices=STRATEGIES)
    place.add_argument(
        "--row-slice-threshold",
        type=int,
        default=None,
        help="elements from which a table is row-sliced (default: the item "
        "table is row-sliced on more than one rank)",
    )
    place.add_argument("--column-slice-threshold", type=int, default=None)
    place.add_argument("--data-parallel-threshold", type=int, default=None)
    place.add_argument("--backend", default="auto", choices=BACKEND_NAMES)
    place.add_argument("--no-validate-ids", dest="validate_ids", action="store_false")
    add_dynamic_options(place)
    out = ap.add_argument_group("output")
    add_run_options(out, checkpoint_help="save each epoch; resume from its newest checkpoint")
    return ap


def data_problem(args, size: int) -> str | None:
    """The first problem with the data options, or None; fills in the synthetic defaults."""
    if args.valid_dir and not args.train_dir:
        return f"--valid-dir needs --train-dir. Received: --valid-dir={args.valid_dir!r}"
    if args.train_dir:
        for name in ("items", "max_length", "sessions", "valid_sessions", "categories"):
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                return (
                    f"{flag} is for synthetic sessions, not --train-dir (the catalog and "
                    f"sessions come from the dataset). "
                    f"Received: {flag}={getattr(args, name)}"
                )
        if not args.valid_dir:
            return (
                f"--train-dir needs --valid-dir (held-out sessions for recall@10). "
                f"Received: --train-dir={args.train_dir!r}"
            )
        return None
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.items < 3:
        return f"--items must be >= 3 (id 0 is padding). Received: --items={args.items}"
    if args.categories < 0 or args.categories == 1:
        return (
            f"--categories must be 0 (none) or >= 2 (0 is padding). "
            f"Received: --categories={args.categories}"
        )
    if args.max_length < 2:
        return f"--max-length must be >= 2. Received: --max-length={args.max_length}"
    if args.sessions < 1:
        return f"--sessions must be >= 1. Received: --sessions={args.sessions}"
    valid = args.valid_sessions
    if valid is not None and valid < 0:
        return f"--valid-sessions must be >= 0. Received: --valid-sessions={valid}"
    if args.sessions < args.batch_size * size:
        return (
            f"--sessions must hold at least one global batch (batch size {args.batch_size} "
            f"x {size} ranks). Received: --sessions={args.sessions}"
        )
    if valid and valid < args.batch_size * size:
        return (
            f"--valid-sessions must be 0 or hold at least one global batch (batch size "
            f"{args.batch_size} x {size} ranks). Received: --valid-sessions={valid}"
        )
    return None


def check_options(args) -> str | None:
    """The first problem with the options themselves, or None; the same on every rank."""
    size = world()[0]
    for name in ("batch_size", "epochs", "dim", "layers", "heads"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be >= 1. Received: {flag}={getattr(args, name)}"
    problem = data_problem(args, size)
    if problem:
        return problem
    for name in ("hidden", "cpu_threads", "checkpoint_every", "checkpoint_keep"):
        value, least = getattr(args, name), int(name != "checkpoint_keep")
        if value is not None and value < least:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be >= {least}. Received: {flag}={value}"
    for name in ("checkpoint_every", "checkpoint_keep"):
        if getattr(args, name) is not None and not args.checkpoint_dir:
            flag = "--" + name.replace("_", "-")
            return f"{flag} needs --checkpoint-dir. Received: {flag}={getattr(args, name)}"
    lr = args.learning_rate
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        return f"--learning-rate must be a finite number > 0. Received: --learning-rate={lr}"
    if problem := dynamic_problem(args):
        return problem
    if args.dynamic and args.embeddings != "distributed":
        return (
            f"--dynamic needs --embeddings distributed (mm.Embeddings has fixed tables). "
            f"Received: --dynamic {args.dynamic} --embeddings={args.embeddings}"
        )
    if problem := elastic_problem(args):
        return problem
    if args.encoder == "transformer" and (args.hidden or args.dim) % args.heads:
        return (
            f"--heads must divide the transformer width {args.hidden or args.dim}. "
            f"Received: --heads={args.heads}"
        )
    try:
        validate_options(
            size,
            args.strategy,
            args.column_slice_threshold,
            row_slice_threshold(args, size),
            args.data_parallel_threshold,
        )
    except ValueError as err:
        return str(err)
    return None


def check_host(args) -> str | None:
    """The first problem this host has with the options (installed packages), or None."""
    if args.backend != "auto" and not is_installed(args.backend):
        return (
            "--backend distributed-embeddings needs NVIDIA distributed-embeddings "
            "(scripts/install_distributed_embeddings.sh). Received: "
            "--backend=distributed-embeddings"
        )
    if args.encoder == "transformer" and importlib.util.find_spec("transformers") is None:
        return (
            "--encoder transformer needs the transformers package (pip install "
            "transformers==4.33.3). Received: --encoder=transformer"
        )
    return dataset_dir_problem("--train-dir", args.train_dir) or dataset_dir_problem(
        "--valid-dir", args.valid_dir
    )


def resolve_dataset(args) -> str | None:
    """With ``--train-dir``: reads both schemas and sets ``args.item_column`` and
    ``args.items`` (the catalog); returns the problem as one line, or None. Without it the
    synthetic sessions' column. (Reading a schema loads TensorFlow, hence after the checks.)"""
    args.item_column = ITEM
    if not args.train_dir:
        return None
    from merlin_models_de.apps.common.schemas import load_schema
    from merlin_models_de.apps.next_item.data import item_sequence_column

    try:
        args.item_column, args.items = item_sequence_column(
            load_schema(args.train_dir), "--train-dir", args.train_dir
        )
        valid = load_schema(args.valid_dir)
    except ValueError as err:
        return str(err)
    if args.item_column not in valid.column_names:
        return (
            f"--valid-dir's schema has no column {args.item_column!r} (the item column of "
            f"--train-dir). Received: --valid-dir={args.valid_dir!r}"
        )
    return None


def dynamic_feature_problem(args) -> str | None:
    """The problem with the features ``--dynamic`` names, or None. The item column cannot be
    dynamic: the output is tied to its table and looks rows up by row id, which a dynamic
    table's keys do not have; the other features are the model's (``--categories``)."""
    features = [CATEGORY] if args.categories else []
    for value in args.dynamic:
        name = value.partition("=")[0]
        if name == args.item_column:
            return (
                f"--dynamic cannot take the item column {name!r}: the output ({args.loss}) "
                "is tied to its table and looks rows up by row id, which a dynamic table's "
                "keys do not have (docs/dynamic.md, Limits). Give --dynamic another feature "
                f"(--categories N --dynamic {CATEGORY}). Received: --dynamic {value}"
            )
        if name not in features:
            return (
                f"--dynamic names no feature of the model (its features besides the item "
                f"column {args.item_column!r}: {features}). Received: --dynamic {value}"
            )
    return None


def catalog_problem(args) -> str | None:
    """The problem when one rank's part of the item table (with its optimizer slots) does not
    fit in the memory this host has for each rank, or None."""
    size = world()[0]
    rows = -(-args.items // size)  # row-sliced over the ranks (at best)
    needed = rows * args.dim * 4 * (1 + OPTIMIZER_SLOTS[args.optimizer])
    flag, value = (
        ("--train-dir", repr(args.train_dir)) if args.train_dir else ("--items", args.items)
    )
    return memory_problem(
        f"The item table ({args.items:,} items x {args.dim} with "
        f"{args.optimizer}'s slots, over {size} rank(s))",
        needed,
        flag,
        value,
    )


def main(argv=None) -> int:
    """Entry point (console script ``mmde-next-item``); returns the exit code."""
    args = checked_arguments(parser(), argv, check_options, check_host)
    if args is None:
        return 2  # every rank: horovodrun then stops the job with a non-zero status
    problem = (
        resolve_dataset(args)
        or dynamic_feature_problem(args)
        or row_hashing_problem(args, [args.item_column])
        or parquet_files_problem("--train-dir", args.train_dir)
        or parquet_files_problem("--valid-dir", args.valid_dir)
        or catalog_problem(args)
    )
    if problem:  # every rank reads the same schema files: every rank stops here
        report_problem(problem, host_dependent=True)
        return 2
    if args.elastic:  # the world size changes: the item table's placement is re-planned
        from merlin_models_de.apps.next_item.elastic import run
    else:
        args.row_slice_threshold = row_slice_threshold(args, world()[0])  # the run's, resolved
        from merlin_models_de.apps.next_item.run import run

    report = run(args, STARTED)
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main())
