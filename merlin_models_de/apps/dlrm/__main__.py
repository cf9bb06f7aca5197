"""DLRM training command: ``horovodrun -np N python -m merlin_models_de.apps.dlrm [options]``.

Trains ``mm.DLRMModel`` with ``DistributedEmbeddings`` on synthetic Criteo-shaped data
(``--rows``; every rank makes only its own rows, the same set whatever the world size) or on
a directory of parquet files with a Merlin schema (NVTabular's output: ``--train-dir``,
``--valid-dir``). Rank 0 prints the placement, Keras progress, and after each epoch the
global samples/s, loss, validation AUC and logloss, and every rank's embedding bytes and
peak resident memory; a JSON report goes to ``--report`` (default: ``report.json`` in the
checkpoint directory). With ``--checkpoint-dir`` holding a checkpoint, training resumes.

Examples:
    horovodrun -np 2 -H localhost:2 python -m merlin_models_de.apps.dlrm --rows 200000 --epochs 2
    horovodrun -np 8 -H a:4,b:4 mmde-dlrm --train-dir /data/train --valid-dir /data/valid \\
        --strategy memory_optimized --column-slice-threshold 16777216 --optimizer adagrad

Options are checked before TensorFlow loads; a bad one exits with status 2 and one line
(under horovodrun every rank exits 2; rank 0 prints the line, and a problem that depends on
the host, such as a missing directory, is also printed by the first rank of each host that
sees it). A run resumed from a checkpoint written mid-epoch continues that epoch after its
last trained batch, so every batch is trained once.
"""

import sys
import time

from merlin_models_de.apps.common.options import checked_arguments, report_problem
from merlin_models_de.apps.common.row_hashing import row_hashing_problem
from merlin_models_de.apps.dlrm.options import check_host, check_options, parser

STARTED = time.perf_counter()


def main(argv=None) -> int:
    """Entry point (console script ``mmde-dlrm``); returns the exit code."""
    args = checked_arguments(parser(description=__doc__), argv, check_options, check_host)
    if args is None:
        return 2  # every rank: horovodrun then stops the job with a non-zero status
    problem = row_hashing_problem(args)
    if problem:  # every rank reads the same schema files: every rank stops here
        report_problem(problem, host_dependent=True)
        return 2
    if args.elastic:
        from merlin_models_de.apps.dlrm.elastic import run
    else:
        from merlin_models_de.apps.dlrm.run import run

    report = run(args, STARTED)
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main())
