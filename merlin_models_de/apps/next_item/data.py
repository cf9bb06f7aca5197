"""The next-item command's data: deterministic synthetic sessions per rank, and the item
column of a parquet dataset's schema (only NumPy at import: the sessions need no TensorFlow).

A session is 2..``max_length`` item ids (ids 1..items-1; 0 is left free as Merlin's padding id).
Items have a Zipf-like popularity (the item of popularity rank ``r`` is drawn with
probability proportional to ``1 / (r + 1) ** exponent``), and each next item is, with
probability 1/2, the item just after the previous one in popularity order, else a fresh
draw: a model can learn both the popularity and the transitions, so recall means something.
Popularity ranks are scattered over the id range by a fixed permutation, so popular items
fall on every rank's rows of a row-sliced table.

Sessions are made in fixed blocks of ``BLOCK_SESSIONS``, each from its own seed, so session
``i`` depends only on ``(seed, i)``: a rank makes only its own sessions, and the global set is
the same whatever the world size (see :func:`merlin_models_de.apps.common.synthetic.rank_rows`).

Example:
    >>> s = make_sessions(1000, 5, [(0, 3)], seed=0)
    >>> len(s["lengths"]), int(s["lengths"].sum()) == len(s["values"])
    (3, True)
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

ITEM = "item_id"  # the synthetic sessions' item column
CATEGORY = "category"  # with --categories: each position's item category, a second sequence
BLOCK_SESSIONS = 4096
EXPONENT = 1.1  # popularity: Zipf-like, about a quarter of all draws hit the 10 most popular


@lru_cache(maxsize=4)
def _popularity(items: int, exponent: float):
    """(cumulative probability by popularity rank, multiplier of the rank -> id permutation)."""
    weights = 1.0 / np.arange(1, items, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    n = items - 1
    step = int(n * 0.618) | 1  # a multiplier coprime with n permutes 0..n-1
    while math.gcd(step, n) != 1:
        step += 2
    return cdf, step


def _ids(ranks: np.ndarray, items: int, step: int) -> np.ndarray:
    return 1 + (ranks * step) % (items - 1)


def _block(items: int, max_length: int, index: int, seed: int, exponent: float):
    cdf, step = _popularity(items, exponent)
    rng = np.random.default_rng([seed, index])
    lengths = rng.integers(2, max_length + 1, BLOCK_SESSIONS)
    total = int(lengths.sum())
    fresh = np.minimum(np.searchsorted(cdf, rng.random(total)), items - 2)
    follow = rng.random(total) < 0.5
    starts = np.zeros(total, dtype=bool)
    starts[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = True
    ranks = fresh.copy()
    for i in np.flatnonzero(follow & ~starts):  # successor of the previous popularity rank
        ranks[i] = (ranks[i - 1] + 1) % (items - 1)
    return _ids(ranks, items, step), lengths


def make_sessions(
    items: int,
    max_length: int,
    ranges: list[tuple[int, int]],
    seed: int = 0,
    exponent: float = EXPONENT,
) -> dict:
    """``{"values": ids, "lengths": per-session lengths}`` of the sessions in ``ranges``
    (global session indices ``[lo, hi)``, in order)."""
    values, lengths = [], []
    current, block = -1, None  # ranges come in order: one block in memory at a time
    for lo, hi in ranges:
        for b in range(lo // BLOCK_SESSIONS, (hi - 1) // BLOCK_SESSIONS + 1):
            if b != current:
                current = b
                ids, lens = _block(items, max_length, b, seed, exponent)
                block = (ids, lens, np.concatenate([[0], np.cumsum(lens)]))
            ids, lens, offsets = block
            start = b * BLOCK_SESSIONS
            a, z = max(lo, start) - start, min(hi, start + BLOCK_SESSIONS) - start
            values.append(ids[offsets[a] : offsets[z]])
            lengths.append(lens[a:z])
    if not values:
        return {"values": np.zeros(0, np.int64), "lengths": np.zeros(0, np.int64)}
    return {
        "values": np.concatenate(values).astype(np.int64),
        "lengths": np.concatenate(lengths).astype(np.int64),
    }


def categories_of(ids: np.ndarray, categories: int) -> np.ndarray:
    """Each item's category, 1..categories-1 (0 stays padding), a fixed function of its id.

    Example:
        >>> categories_of(np.array([0, 1, 2]), 50).tolist()
        [0, 31, 12]
    """
    return np.where(ids == 0, 0, 1 + (ids * 7919) % (categories - 1))


def session_schema(items: int, max_length: int, name: str = "item_id", categories: int = 0):
    """A Merlin schema of one ragged item-id sequence column tagged ITEM_ID and SEQUENCE, and
    with ``categories`` a ragged category sequence beside it (:data:`CATEGORY`)."""
    from merlin.schema import ColumnSchema, Schema, Tags

    def sequence(column, tags, rows):
        return ColumnSchema(
            column,
            tags=[Tags.CATEGORICAL, *tags, Tags.SEQUENCE],
            dtype=np.int64,
            is_list=True,
            is_ragged=True,
            properties={
                "domain": {"min": 0, "max": rows - 1, "name": column},
                "value_count": {"min": 2, "max": max_length},
            },
        )

    columns = [sequence(name, [Tags.ITEM, Tags.ID], items)]
    if categories:
        columns.append(sequence(CATEGORY, [], categories))
    return Schema(columns)


def item_sequence_column(schema, flag: str, path: str) -> tuple[str, int]:
    """``(name, catalog size)`` of the item-id list column of a dataset's Merlin schema: the
    one column tagged ITEM and ID that is a list (``is_list`` or the LIST tag); the catalog
    is its integer domain's max + 1.

    Raises:
        ValueError: one line naming ``flag``, ``path`` and what was found, when the schema
            has no such column or more than one, or the column has no integer domain max.
    """
    from merlin.schema import Tags

    found = [
        c.name
        for c in schema
        if {Tags.ITEM, Tags.ID} <= set(c.tags) and (c.is_list or Tags.LIST in c.tags)
    ]
    if len(found) != 1:
        what = (
            f"{len(found)} such columns {found}"
            if found
            else f"none among its columns {schema.column_names}"
        )
        raise ValueError(
            f"{flag}'s schema must have exactly one item-id list column (tags "
            f"ITEM and ID, a list); it has {what}. Received: {flag}={path!r}"
        )
    column = schema[found[0]]
    domain = column.int_domain
    if domain is None or domain.max is None:
        raise ValueError(
            f"The item column {column.name!r} in {flag}'s schema has no integer "
            f"domain max (the catalog is max + 1 rows). Received: {flag}={path!r}"
        )
    return column.name, int(domain.max) + 1


def item_model_schema(schema, name: str):
    """The schema the model and the loader use: only the item column, tagged CATEGORICAL (the
    loader and the embedding block take it) and SEQUENCE (the session transforms do)."""
    from merlin.schema import Schema, Tags

    column = schema[name]
    return Schema([column.with_tags([Tags.CATEGORICAL, Tags.SEQUENCE])])


def row_slice_threshold(args, size: int) -> int | None:
    """The block's ``row_slice_threshold``: the option, else the item table's elements on
    more than one rank (the table row-sliced), else None (also while the catalog is not
    known yet: a parquet dataset's comes from its schema)."""
    if args.row_slice_threshold is not None:
        return args.row_slice_threshold
    return args.items * args.dim if size > 1 and args.items else None
