"""Ids that keep arriving: fixed tables with a vocabulary frozen on day 1 against dynamic tables.

A synthetic click log over ``--days`` days. Each day brings new users and new items (cohorts);
a cohort's share of the day's clicks is ``--new-item-share`` (items; ``--new-user-share`` for
users) on the day it arrives and falls by ``--decay`` each day after, the rest going to the
catalog that was there before day 1. Within a cohort, popularity is Zipf-like. A click's
probability is ``sigmoid(2 <u, v> / sqrt(4) + b_u + b_i - position - 1.2)``: 4-dimensional user
and item factors and biases drawn per id, and a position in the page, so a row trained on an
id's clicks predicts its next ones.

The vocabulary is fitted on day 1 only, as NVTabular's ``Categorify`` fitted once would be.
Both sides train the same DLRM (``mm.DistributedEmbeddings``, dim ``--dim``, a bottom MLP for the
position) one pass over day d, then predict day d+1:

- ``fixed``: ``user_id`` and ``item_id`` through the frozen vocabulary; an id first seen after
  day 1 goes to the out-of-vocabulary row 0 (rows: day 1's ids + 1);
- ``dynamic``: the raw ids as 64-bit keys of ``DynamicTable`` s of the same rows
  (``--capacity-scale`` times them), admitted after ``--admit-after`` sightings and evicted
  by ``--evict`` when full (docs/dynamic.md).

Each day the report gives both sides' validation AUC (every row, and the rows with a user or
item outside day 1's vocabulary), and the share of the day's lookups (users and items) that hit
a trained row: an id in the vocabulary for ``fixed``, an id holding a row when the day starts
for ``dynamic``; beside them the share of lookups of ids never seen before (no table can have
a row for them). The global batch is ``--global-batch-size`` whatever the world size, so one
process and N ranks train on the same batches. Output: a markdown table on stdout (rank 0) and
the JSON report at ``--report``.

Examples:
    python -m merlin_models_de.apps.bench.arrivals --days 8
    horovodrun -np 2 -H localhost:2 python -m merlin_models_de.apps.bench arrivals --days 8
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from merlin_models_de.apps.common.console import quiet_imports
from merlin_models_de.apps.common.dynamic import POLICIES, counters_text
from merlin_models_de.apps.common.optimizers import OPTIMIZERS
from merlin_models_de.apps.common.options import OneLineParser, checked_arguments, world
from merlin_models_de.apps.common.program import program_name

FACTORS = 4  # latent dimensions of the click model's users and items
KINDS = ("user", "item")
COHORT_BITS = 24  # a raw id: (kind + 1) << 40 | cohort << 24 | member: distinct over kinds


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog=program_name("merlin_models_de.apps.bench.arrivals"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    log = ap.add_argument_group("the click log")
    log.add_argument("--days", type=int, default=8, help="day 1 fits the vocabulary")
    log.add_argument("--clicks", type=int, default=40960, help="rows a day")
    log.add_argument("--users", type=int, default=4000, help="users before day 1")
    log.add_argument("--new-users", type=int, default=800, help="new users each day")
    log.add_argument("--items", type=int, default=6000, help="items before day 1")
    log.add_argument("--new-items", type=int, default=1500, help="new items each day")
    log.add_argument(
        "--new-user-share", type=float, default=0.12, help="of a day's clicks: its new users"
    )
    log.add_argument(
        "--new-item-share", type=float, default=0.2, help="of a day's clicks: its new items"
    )
    log.add_argument(
        "--decay", type=float, default=0.6, help="a cohort's share, each day after its first"
    )
    log.add_argument("--seed", type=int, default=0)
    train = ap.add_argument_group("training")
    train.add_argument("--dim", type=int, default=16)
    train.add_argument(
        "--global-batch-size", type=int, default=512, help="rows a step over all ranks"
    )
    # Adam: the rows of ids seen a few times a day move at once (Adagrad's first steps on a
    # row are too small to learn it in one pass)
    train.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    train.add_argument("--learning-rate", type=float, default=0.01, help="of the global batch")
    dyn = ap.add_argument_group("the dynamic side")
    dyn.add_argument(
        "--capacity-scale", type=float, default=1.0, help="its rows: the fixed rows times this"
    )
    dyn.add_argument("--admit-after", type=int, default=1, help="sightings before a row")
    dyn.add_argument(
        "--evict",
        default="lfu,lru",
        help=f"when a share is full: one dynamic side per policy ({', '.join(POLICIES)})",
    )
    out = ap.add_argument_group("output")
    out.add_argument("--report", default=None, help="JSON report (rank 0 writes it)")
    return ap


def check_options(args) -> str | None:
    """The first problem with the options, or None (the same on every rank)."""
    size = world()[0]
    for name in ("days", "clicks", "users", "new_users", "items", "new_items", "dim"):
        if getattr(args, name) < (2 if name == "days" else 1):
            flag = "--" + name.replace("_", "-")
            least = 2 if name == "days" else 1
            return f"{flag} must be >= {least}. Received: {flag}={getattr(args, name)}"
    for name in ("new_user_share", "new_item_share", "decay"):
        if not 0 < getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be in (0, 1). Received: {flag}={getattr(args, name)}"
    for kind in KINDS:  # every cohort's shares over the days must leave the catalog some
        share = getattr(args, f"new_{kind}_share")
        if share / (1 - args.decay) >= 1:
            return (
                f"--new-{kind}-share / (1 - --decay) must be < 1 (the new cohorts' shares "
                f"add up to it). Received: --new-{kind}-share={share} --decay={args.decay}"
            )
    gb = args.global_batch_size
    if gb < size or gb % size:
        return (
            f"--global-batch-size must be a multiple of the {size} rank(s). "
            f"Received: --global-batch-size={gb}"
        )
    if args.clicks < gb:
        return f"--clicks must hold one global batch ({gb}). Received: --clicks={args.clicks}"
    if not args.capacity_scale > 0:
        return f"--capacity-scale must be > 0. Received: --capacity-scale={args.capacity_scale}"
    if args.admit_after < 1:
        return f"--admit-after must be >= 1. Received: --admit-after={args.admit_after}"
    policies = args.evict.split(",")
    if not set(policies) <= set(POLICIES) or len(set(policies)) < len(policies):
        return (
            f"--evict takes distinct policies among {', '.join(POLICIES)}, comma-separated. "
            f"Received: --evict={args.evict}"
        )
    return None


def sides(args) -> list[str]:
    """The runs compared: ``fixed``, then ``dynamic/<policy>`` for each ``--evict`` policy."""
    return ["fixed"] + [f"dynamic/{p}" for p in args.evict.split(",")]


# ---------------------------------------------------------------- the click log (NumPy only)


def cohort_shares(day: int, new_share: float, decay: float) -> np.ndarray:
    """Day ``day``'s click shares by cohort: index 0 the catalog before day 1, index c the
    ids that arrived on day c (1..day).

    Example:
        >>> cohort_shares(3, 0.2, 0.5).round(3).tolist()
        [0.65, 0.05, 0.1, 0.2]
    """
    new = new_share * decay ** np.arange(day)[::-1]  # cohort c is day - c days old
    return np.concatenate([[1.0 - new.sum()], new])


def _zipf_cdf(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def _factors(args, kind: int, cohort: int, n: int) -> np.ndarray:
    """``[n, FACTORS + 1]``: the cohort's latent factors and biases (fixed by the seed)."""
    rng = np.random.default_rng([args.seed, 7, kind, cohort])
    out = rng.normal(size=(n, FACTORS + 1))
    out[:, -1] *= 0.7  # the per-id bias
    return out


def _draw(args, day: int, kind: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(raw ids, factors with bias) of one kind's ids for the day's clicks."""
    name = KINDS[kind]
    base, new = getattr(args, f"{name}s"), getattr(args, f"new_{name}s")
    exponent = 0.7 if name == "user" else 0.9  # users click more evenly than items sell
    shares = cohort_shares(day, getattr(args, f"new_{name}_share"), args.decay)
    cohort = rng.choice(len(shares), size=args.clicks, p=shares)
    member = np.empty(args.clicks, np.int64)
    factors = np.empty((args.clicks, FACTORS + 1))
    for c in np.unique(cohort):
        rows = np.flatnonzero(cohort == c)
        n = base if c == 0 else new
        # popularity ranks scattered over the cohort's members
        ranks = np.searchsorted(_zipf_cdf(n, exponent), rng.random(rows.size))
        member[rows] = (np.minimum(ranks, n - 1) * 7919) % n
        factors[rows] = _factors(args, kind, int(c), n)[member[rows]]
    ids = ((kind + 1) << 40) | (cohort.astype(np.int64) << COHORT_BITS) | member
    return ids, factors


def click_log(args, day: int) -> dict:
    """Day ``day``'s clicks (1-based): ``user_id``, ``item_id`` (raw int64 ids), ``position``
    and ``click``, the same arrays on every rank."""
    rng = np.random.default_rng([args.seed, day])
    users, u = _draw(args, day, 0, rng)
    items, v = _draw(args, day, 1, rng)
    position = rng.random(args.clicks)
    logit = (
        2.0 * (u[:, :FACTORS] * v[:, :FACTORS]).sum(1) / np.sqrt(FACTORS)
        + u[:, -1]
        + v[:, -1]
        - position
        - 1.2
    )
    click = rng.random(args.clicks) < 1.0 / (1.0 + np.exp(-logit))
    return {
        "user_id": users,
        "item_id": items,
        "position": position.astype(np.float32),
        "click": click.astype(np.float32),
    }


def frozen_rows(ids: np.ndarray, vocabulary: np.ndarray) -> np.ndarray:
    """Each id's row in a table of ``vocabulary`` (sorted): 1 + its index, or 0 (the
    out-of-vocabulary row) for an id not in it.

    Example:
        >>> frozen_rows(np.array([7, 3, 9]), np.array([3, 7])).tolist()
        [2, 1, 0]
    """
    at = np.minimum(np.searchsorted(vocabulary, ids), len(vocabulary) - 1)
    return np.where(vocabulary[at] == ids, at + 1, 0)


def auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """The exact ROC AUC (ties counted half), or None without both classes.

    Example:
        >>> auc(np.array([0, 1, 0, 1]), np.array([0.1, 0.9, 0.5, 0.5]))
        0.875
    """
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if not positives or not negatives:
        return None
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    mean_rank = (upper - (counts - 1) / 2.0)[inverse]  # 1-based, ties averaged
    return float(
        (mean_rank[labels > 0].sum() - positives * (positives + 1) / 2) / (positives * negatives)
    )


# ---------------------------------------------------------------- training (TensorFlow)


def _schema(vocab: dict | None):
    """The model's schema: the two id columns with the fixed rows as their domain (or none:
    a dynamic table's ids are keys), the position and the click."""
    import merlin.dtypes as md
    from merlin.schema import ColumnSchema, Schema, Tags

    def ids(name, tag):
        domain = None if vocab is None else {"min": 0, "max": len(vocab[name]), "name": name}
        return ColumnSchema(
            name,
            dtype=md.int64,
            tags=[Tags.CATEGORICAL, tag],
            properties={"domain": domain} if domain else {},
        )

    return Schema(
        [
            ids("user_id", Tags.USER_ID),
            ids("item_id", Tags.ITEM_ID),
            ColumnSchema("position", dtype=md.float32, tags=[Tags.CONTINUOUS]),
            ColumnSchema("click", dtype=md.float32, tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]),
        ]
    )


def _model(args, side: str, vocab: dict):
    import merlin.models.tf as mm
    import tensorflow as tf
    from merlin.schema import Tags

    import merlin_models_de  # noqa: F401  (registers mm.DistributedEmbeddings)
    from merlin_models_de import comm
    from merlin_models_de.tables import DynamicTable

    schema = _schema(vocab if side == "fixed" else None)
    dynamic = {}
    if side != "fixed":
        policy = side.partition("/")[2]
        evict = None if policy == "never" else policy
        for name, known in vocab.items():  # the fixed table's rows: its ids + the OOV row
            rows = max(comm.size(), round((len(known) + 1) * args.capacity_scale))
            dynamic[name] = DynamicTable(rows, args.admit_after, evict)
    tf.keras.utils.set_random_seed(args.seed)
    emb = mm.DistributedEmbeddings(
        schema.select_by_tag(Tags.CATEGORICAL), dim=args.dim, dynamic_tables=dynamic
    )
    model = mm.DLRMModel(
        schema,
        embeddings=emb,
        bottom_block=mm.MLPBlock([args.dim]),
        top_block=mm.MLPBlock([32]),
        prediction_tasks=mm.BinaryClassificationTask("click"),
    )
    legacy = tf.keras.optimizers.legacy
    rate = args.learning_rate / comm.size()  # Merlin multiplies it by the world size
    if args.optimizer == "rowwise_adagrad":
        from merlin_models_de.kernels.rowwise.adagrad import RowWiseAdagrad

        optimizer = RowWiseAdagrad(rate)
    else:
        optimizer = {"sgd": legacy.SGD, "adagrad": legacy.Adagrad, "adam": legacy.Adam}[
            args.optimizer
        ](rate)
    model.compile(optimizer=optimizer)
    return model, emb


def _my_rows(args, size: int, rank: int) -> np.ndarray:
    """This rank's rows of a day: its part of each full global batch."""
    per = args.global_batch_size // size
    steps = args.clicks // args.global_batch_size
    starts = np.arange(steps) * args.global_batch_size + rank * per
    return (starts[:, None] + np.arange(per)).ravel()


def _inputs(day: dict, rows: np.ndarray, side: str, vocab: dict) -> dict:
    out = {}
    for name in ("user_id", "item_id"):
        ids = day[name][rows]
        out[name] = (frozen_rows(ids, vocab[name]) if side == "fixed" else ids)[:, None]
    out["position"] = day["position"][rows][:, None]
    return out


def _hits(day: dict, side: str, vocab: dict, emb) -> dict:
    """Per kind: which of the day's lookups find a trained row (collective for dynamic)."""
    out = {}
    for name in ("user_id", "item_id"):
        held = vocab[name] if side == "fixed" else emb.dynamic_table(name)[0]  # collective
        out[name] = np.isin(day[name], held)
    return out


def _side(args, side: str, days: list, vocab: dict, rows: np.ndarray) -> list:
    """Trains ``side`` day by day; each day's validation numbers (of the next day)."""
    import tensorflow as tf

    from merlin_models_de import comm

    model, emb = _model(args, side, vocab)
    per = args.global_batch_size // comm.size()
    seen = {name: np.zeros(0, np.int64) for name in vocab}
    results = []
    for d in range(len(days) - 1):
        t0 = time.perf_counter()
        train, valid = days[d], days[d + 1]
        x = _inputs(train, rows, side, vocab)
        y = train["click"][rows][:, None]
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(per, drop_remainder=True)
        model.fit(data, epochs=1, verbose=0, shuffle=False)
        trained = time.perf_counter() - t0
        for name in seen:
            seen[name] = np.union1d(seen[name], train[name])
        batches = tf.data.Dataset.from_tensor_slices(_inputs(valid, rows, side, vocab))
        mine = model.predict(batches.batch(per, drop_remainder=True), verbose=0).ravel()
        scores = np.empty(args.clicks, np.float64)
        for r, part in enumerate(comm.allgather_object(mine, name=f"mmde_arrivals_{side}{d}")):
            scores[_my_rows(args, comm.size(), r)] = part
        every = _my_rows(args, 1, 0)  # the rows of full global batches
        hits = _hits(valid, side, vocab, emb)
        outside = ~np.isin(valid["user_id"], vocab["user_id"]) | ~np.isin(
            valid["item_id"], vocab["item_id"]
        )
        lookups = {k: v[every] for k, v in hits.items()}
        unseen = [~np.isin(valid[name][every], seen[name]) for name in seen]
        entry = {
            "day": d + 2,
            "auc": auc(valid["click"][every], scores[every]),
            "auc_outside_vocabulary": auc(
                valid["click"][every][outside[every]], scores[every][outside[every]]
            ),
            "hit_share": float(np.mean(np.concatenate(list(lookups.values())))),
            "hit_share_by_feature": {k: float(v.mean()) for k, v in lookups.items()},
            "never_seen_share": float(np.mean(np.concatenate(unseen))),
            "outside_vocabulary_rows": float(outside[every].mean()),
            "seconds": time.perf_counter() - t0,
            "train_seconds": trained,
        }
        if side != "fixed":
            entry["dynamic_tables"] = emb.dynamic_counters()
        results.append(entry)
        if comm.rank() == 0:
            print(_day_line(side, entry), flush=True)
    return results


def _day_line(side: str, e: dict) -> str:
    extra = counters_text(e.get("dynamic_tables", {}))
    return (
        f"{side} day {e['day']}: auc={_num(e['auc'])} "
        f"auc(outside day 1)={_num(e['auc_outside_vocabulary'])} "
        f"hits={e['hit_share']:.3f} ({e['seconds']:.1f} s){extra}"
    )


def _num(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def markdown(report: dict) -> str:
    """The results as a markdown table: one row per validation day, one column per side
    (AUC / AUC on the rows with an id outside day 1 / the share of lookups on a trained row)."""
    names = list(report["sides"])
    runs = [report["sides"][n] for n in names]
    lines = [
        "| day | rows with an id outside day 1 | lookups of ids never seen | "
        + " | ".join(f"{n}: AUC / outside day 1 / hits" for n in names)
        + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]

    def cell(e):
        return f"{_num(e['auc'])} / {_num(e['auc_outside_vocabulary'])} / {e['hit_share']:.1%}"

    for entries in zip(*runs):
        first = entries[0]
        lines.append(
            f"| {first['day']} | {first['outside_vocabulary_rows']:.1%} "
            f"| {first['never_seen_share']:.1%} | " + " | ".join(cell(e) for e in entries) + " |"
        )
    lines.append("| mean | | | " + " | ".join(cell(report["mean"][n]) for n in names) + " |")
    return "\n".join(lines)


def _mean(entries: list) -> dict:
    out = {}
    for key in ("auc", "auc_outside_vocabulary", "hit_share"):
        values = [e[key] for e in entries if e[key] is not None]
        out[key] = float(np.mean(values)) if values else None
    return out


def run(args, started: float) -> dict:
    """Both sides on the same log; returns the report (rank 0 writes it)."""
    from merlin_models_de import comm
    from merlin_models_de.apps.common.cores import configure_threads
    from merlin_models_de.apps.common.reports import peak_rss_bytes, write_report

    threads = configure_threads(None)
    days = [click_log(args, d) for d in range(1, args.days + 1)]
    vocab = {name: np.unique(days[0][name]) for name in ("user_id", "item_id")}
    rows = _my_rows(args, comm.size(), comm.rank())
    report: dict = {
        "command": "merlin_models_de.apps.bench.arrivals",
        "options": vars(args),
        "world_size": comm.size(),
        "cpu_threads": threads,
        "vocabulary": {name: len(v) for name, v in vocab.items()},
        "new_id_share": {  # of each day's clicks: ids arrived that day or the day before
            kind: float(
                sum(cohort_shares(args.days, getattr(args, f"new_{kind}_share"), args.decay)[-2:])
            )
            for kind in KINDS
        },
    }
    report["sides"], seconds = {}, {}
    for side in sides(args):
        t0 = time.perf_counter()
        report["sides"][side] = _side(args, side, days, vocab, rows)
        seconds[side] = time.perf_counter() - t0
    report["mean"] = {side: _mean(entries) for side, entries in report["sides"].items()}
    report["seconds"] = seconds
    report["total_seconds"] = time.perf_counter() - started
    report["peak_rss_bytes"] = comm.allgather_object(peak_rss_bytes(), name="mmde_arrivals_rss")
    if comm.rank() == 0:
        print(markdown(report), flush=True)
        took = ", ".join(f"{side} {t:.0f} s" for side, t in seconds.items())
        print(f"{comm.size()} rank(s): {took}; {report['total_seconds']:.0f} s in all", flush=True)
    write_report(args.report, report)
    comm.barrier(name="mmde_arrivals_done")
    return report


def main(argv=None) -> int:
    """Entry point; returns the exit code."""
    started = time.perf_counter()
    quiet_imports()
    args = checked_arguments(parser(), argv, check_options, lambda _: None)
    if args is None:
        return 2
    return 0 if run(args, started) else 1


if __name__ == "__main__":
    sys.exit(main())
