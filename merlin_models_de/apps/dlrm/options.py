"""The DLRM command's options and their checks (no TensorFlow, no Horovod here).

The command (``python -m merlin_models_de.apps.dlrm``) parses them, and so does the bench's
step breakdown, which times one step of the same model (the bench may import the command it
measures; the command never imports the bench).
"""

from __future__ import annotations

import argparse
import math

from merlin_models_de.apps.common.dynamic import add_dynamic_options, dynamic_problem
from merlin_models_de.apps.common.optimizers import OPTIMIZERS, add_learning_rate
from merlin_models_de.apps.common.options import (
    EMBEDDINGS,
    INPUTS,
    LOCAL_TABLES,
    OneLineParser,
    add_run_options,
    dataset_dir_problem,
    elastic_problem,
    exchange_of,
    ints,
    parquet_files_problem,
    placement_of,
    world,
)
from merlin_models_de.apps.common.program import program_name
from merlin_models_de.apps.common.row_hashing import add_hashing_option
from merlin_models_de.apps.common.schemas import synthetic_dataset_names
from merlin_models_de.backends.options import EXCHANGE_DTYPES
from merlin_models_de.backends.registry import BACKEND_NAMES, is_installed
from merlin_models_de.planner import STRATEGIES
from merlin_models_de.planner.strategies import NVIDIA_STRATEGIES
from merlin_models_de.tables import TABLE_DTYPES, narrow_table_bytes

MODULE = "merlin_models_de.apps.dlrm"


def parser(prog: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
    """The DLRM command's options (``prog`` and ``description``: the help's, of the command
    that parses them; ``prog`` defaults to the DLRM command as the user started it)."""
    ap = OneLineParser(
        prog=prog or program_name(MODULE),
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = ap.add_argument_group("data")
    data.add_argument("--rows", type=int, default=100_000, help="synthetic training rows")
    data.add_argument(
        "--valid-rows",
        type=int,
        default=None,
        help="synthetic validation rows (default: rows / 10; 0: none)",
    )
    data.add_argument("--dataset", default="criteo", help="Merlin synthetic schema to imitate")
    data.add_argument(
        "--max-table-rows",
        type=int,
        default=None,
        help="cap every synthetic table at this many rows (quick runs)",
    )
    data.add_argument(
        "--table-scale",
        type=float,
        default=1.0,
        help="every synthetic table's rows times this (bigger models)",
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the data and initial weights")
    data.add_argument("--train-dir", default=None, help="parquet files + Merlin schema")
    data.add_argument("--valid-dir", default=None)
    add_hashing_option(data)
    data.add_argument(
        "--input",
        default="tf.data",
        choices=INPUTS,
        help="tf.data: this rank's Loader batches as a native tf.data pipeline "
        "(loader_dataset; scalar columns), loader: Merlin's Loader itself",
    )
    model = ap.add_argument_group("model and training")
    model.add_argument("--dim", type=int, default=16)
    model.add_argument(
        "--bottom-mlp",
        type=ints,
        default=[128],
        help="hidden widths of the bottom MLP (dim is appended)",
    )
    model.add_argument("--top-mlp", type=ints, default=[128, 64])
    model.add_argument("--batch-size", type=int, default=512, help="rows per rank per step")
    model.add_argument("--epochs", type=int, default=1)
    model.add_argument("--optimizer", default="adagrad", choices=OPTIMIZERS)
    model.add_argument(
        "--steps-per-execution",
        type=int,
        default=1,
        help="training steps per call into TensorFlow (Keras compile's "
        "steps_per_execution: less per-step Python and host work)",
    )
    add_learning_rate(model)
    place = ap.add_argument_group("placement")
    place.add_argument(
        "--embeddings",
        default="distributed",
        choices=EMBEDDINGS + (LOCAL_TABLES,),
        help="distributed: mm.DistributedEmbeddings; merlin: mm.Embeddings, data "
        "parallel (a baseline); local-tables: mm.Embeddings whose copies "
        "each rank trains alone, only the dense gradients averaged: not a "
        "valid training, the speed bound of an exact sharded step",
    )
    # work_balanced: 7-8% more samples/s than memory_optimized on Criteo, 2 ranks
    # (docs/design.md, "Measured decisions")
    place.add_argument(
        "--strategy",
        default="work_balanced",
        choices=STRATEGIES,
        help="work_balanced places for this run's --batch-size and --optimizer (mmde-plan "
        "given the same options prints the placement)",
    )
    place.add_argument("--column-slice-threshold", type=int, default=None)
    place.add_argument("--row-slice-threshold", type=int, default=None)
    place.add_argument("--data-parallel-threshold", type=int, default=None)
    place.add_argument("--backend", default="auto", choices=BACKEND_NAMES)
    place.add_argument("--no-validate-ids", dest="validate_ids", action="store_false")
    place.add_argument(
        "--no-exchange-ahead",
        dest="exchange_ahead",
        action="store_false",
        help="exchange each batch's ids inside its step, not one batch ahead "
        "in the input pipeline (--input tf.data)",
    )
    place.add_argument(
        "--no-merge-backward",
        dest="merge_backward",
        action="store_false",
        help="send the rows' gradients back in their own all-to-all, then "
        "allreduce the dense gradients (two rounds, not one)",
    )
    place.add_argument(
        "--exchange-dtype",
        default=None,
        choices=EXCHANGE_DTYPES,
        help="rows and their gradients cross ranks in this dtype (half the "
        "bytes; horovod backend)",
    )
    place.add_argument(
        "--table-dtype",
        default=None,
        choices=TABLE_DTYPES,
        help="the sharded tables' storage (16 bits: half the memory; needs --optimizer "
        "rowwise_adagrad; horovod backend)",
    )
    add_dynamic_options(place)
    out = ap.add_argument_group("output")
    add_run_options(out, checkpoint_help="save each epoch; resume from it")
    out.add_argument("--export", default=None, help="SavedModel path (single-process model)")
    return ap


def check_options(args) -> str | None:  # noqa: C901 (one flat check per option)
    """The first problem with the options themselves, or None; the same on every rank."""
    size = world()[0]
    for name in ("rows", "batch_size", "epochs", "dim", "steps_per_execution"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1. Received: {getattr(args, name)}"
    for name in (
        "valid_rows",
        "max_table_rows",
        "checkpoint_every",
        "checkpoint_keep",
        "cpu_threads",
    ):
        value, least = getattr(args, name), int(name not in ("valid_rows", "checkpoint_keep"))
        if value is not None and value < least:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be >= {least}. Received: {flag}={value}"
    problem = dynamic_problem(args)
    if problem:
        return problem
    lr = args.learning_rate
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        return f"--learning-rate must be a finite number > 0. Received: --learning-rate={lr}"
    if not (math.isfinite(args.table_scale) and args.table_scale > 0):
        return (
            "--table-scale must be a finite number > 0. "
            f"Received: --table-scale={args.table_scale}"
        )
    for flag in ("checkpoint_every", "checkpoint_keep"):
        if getattr(args, flag) is not None and not args.checkpoint_dir:
            name = "--" + flag.replace("_", "-")
            return f"{name} needs --checkpoint-dir. Received: {name}={getattr(args, flag)}"
    if problem := elastic_problem(args):
        return problem
    if args.optimizer == "rowwise_adagrad" and args.embeddings != "distributed":
        return (
            f"--optimizer rowwise_adagrad keeps one value per row of the block's tables; "
            f"mm.Embeddings' tables would train element-wise. Use --embeddings distributed. "
            f"Received: --optimizer={args.optimizer} --embeddings={args.embeddings}"
        )
    if args.embeddings == LOCAL_TABLES and args.elastic:
        return (
            f"--embeddings {args.embeddings} is a speed bound for fixed ranks, not an elastic "
            f"training. Received: --embeddings={args.embeddings} --elastic"
        )
    if args.valid_dir and not args.train_dir:
        return f"--valid-dir needs --train-dir. Received: --valid-dir={args.valid_dir!r}"
    if not args.train_dir:
        names = synthetic_dataset_names()  # read from Merlin's source: no TensorFlow yet
        if names is not None and args.dataset not in names:
            return (
                f"--dataset must name a Merlin synthetic dataset ({', '.join(names)}). "
                f"Received: --dataset={args.dataset!r}"
            )
        if args.rows < args.batch_size * size:
            return (
                f"--rows must hold at least one global batch (batch size {args.batch_size} "
                f"x {size} ranks). Received: --rows={args.rows}"
            )
    narrow = narrow_table_bytes(args.table_dtype) is not None
    if narrow and (args.optimizer != "rowwise_adagrad" or args.embeddings != "distributed"):
        return (
            f"--table-dtype {args.table_dtype} stores the block's tables in 16 bits, which "
            "only --optimizer rowwise_adagrad updates (with --embeddings distributed). "
            f"Received: --table-dtype={args.table_dtype} --optimizer={args.optimizer} "
            f"--embeddings={args.embeddings}"
        )
    if narrow and args.backend == "distributed-embeddings":
        return (
            "--table-dtype needs --backend horovod or auto. Received: "
            f"--table-dtype={args.table_dtype} --backend=distributed-embeddings"
        )
    if args.exchange_dtype and args.backend == "distributed-embeddings":
        return (
            "--exchange-dtype needs --backend horovod or auto. Received: "
            f"--exchange-dtype={args.exchange_dtype} --backend=distributed-embeddings"
        )
    if args.backend == "distributed-embeddings" and args.strategy not in NVIDIA_STRATEGIES:
        return (
            f"--backend distributed-embeddings places with {', '.join(NVIDIA_STRATEGIES)} "
            f"only. Received: --strategy={args.strategy}"
        )
    try:  # the objects the model is built with (dlrm/model.py) check their own values
        placement_of(args)
        exchange_of(args)
    except ValueError as err:
        return str(err)
    return None


def check_host(args) -> str | None:
    """The first problem this host has with the options (files, installed packages), or None.

    May differ between hosts, so every host checks for itself.
    """
    if args.backend != "auto" and not is_installed(args.backend):
        return (
            "--backend distributed-embeddings needs NVIDIA distributed-embeddings "
            "(scripts/install_distributed_embeddings.sh). Received: "
            "--backend=distributed-embeddings"
        )
    return (
        dataset_dir_problem("--train-dir", args.train_dir)
        or dataset_dir_problem("--valid-dir", args.valid_dir)
        or parquet_files_problem("--train-dir", args.train_dir)
        or parquet_files_problem("--valid-dir", args.valid_dir)
    )


def check(args) -> str | None:
    """The first problem with ``args`` as one line, or None. No TensorFlow, no Horovod."""
    return check_options(args) or check_host(args)
