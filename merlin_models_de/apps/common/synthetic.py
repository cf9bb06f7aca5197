"""Deterministic synthetic data shaped like a Merlin schema (Criteo by default), per rank.

Row ``i`` of a synthetic set depends only on ``(seed, i)``: rows are made in fixed blocks of
``BLOCK_ROWS``, each from its own seed, so a rank makes only its own rows and the set is the
same whatever the world size (one process with batch N*B sees the rows that N ranks with
batch B see, in the same order). Categorical ids are uniform over the column's table, the
continuous columns standard normal, and the binary label depends on a few of both so that
validation AUC means something.

Example:
    >>> from merlin_models_de.apps.common.synthetic import rank_rows
    >>> rank_rows(10, per_rank=2, world_size=2, rank=1)
    [(2, 4), (6, 8)]
"""

from __future__ import annotations

import numpy as np

BLOCK_ROWS = 65536


def rank_rows(total: int, per_rank: int, world_size: int, rank: int) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` of ``rank``: its slice of every full global batch.

    Rows after the last full global batch belong to no rank (every rank must take the same
    number of steps).
    """
    step = per_rank * world_size
    return [
        (start + rank * per_rank, start + (rank + 1) * per_rank)
        for start in range(0, total - step + 1, step)
    ]


def _block(schema, index: int, seed: int) -> dict:
    from merlin.schema import Tags

    rng = np.random.default_rng([seed, index])
    out, cont, cats = {}, [], []
    for col in schema:
        if Tags.TARGET in col.tags:
            continue
        if Tags.CATEGORICAL in col.tags:
            rows = int(col.int_domain.max) + 1
            out[col.name] = rng.integers(0, rows, BLOCK_ROWS, dtype=np.int64)
            cats.append(col.name)
        else:
            out[col.name] = rng.standard_normal(BLOCK_ROWS)
            cont.append(col.name)
    logit = np.zeros(BLOCK_ROWS)
    for i, name in enumerate(cont[:4]):
        logit += (1.0 if i % 2 == 0 else -1.0) * out[name]
    for name in cats[:4]:
        logit += 0.5 * ((out[name] % 5) - 2.0)
    prob = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(BLOCK_ROWS) < prob).astype(np.int32)
    for col in schema.select_by_tag(Tags.TARGET):
        out[col.name] = label
    return out


def make_rows(schema, ranges: list[tuple[int, int]], seed: int = 0) -> dict:
    """Columns ``{name: array}`` of the rows in ``ranges`` (global row indices), in order."""
    parts: dict[str, list] = {}
    current, block = -1, {}  # ranges come in order: one block in memory at a time
    for lo, hi in ranges:
        for b in range(lo // BLOCK_ROWS, (hi - 1) // BLOCK_ROWS + 1):
            if b != current:
                current, block = b, _block(schema, b, seed)
            start = b * BLOCK_ROWS
            a, z = max(lo, start) - start, min(hi, start + BLOCK_ROWS) - start
            for name, values in block.items():
                parts.setdefault(name, []).append(values[a:z])
    return {name: np.concatenate(v) for name, v in parts.items()}


def rank_dataset(schema, total: int, per_rank: int, world_size: int, rank: int, seed: int = 0):
    """A ``merlin.io.Dataset`` of this rank's rows (one partition), with ``schema``."""
    import pandas as pd
    from merlin.io import Dataset

    columns = make_rows(schema, rank_rows(total, per_rank, world_size, rank), seed)
    frame = pd.DataFrame(columns)[[c for c in schema.column_names if c in columns]]
    return Dataset(frame, schema=schema, npartitions=1)


def capped_schema(schema, max_rows: int | None, scale: float = 1.0):
    """``schema`` with every table's rows times ``scale`` (the capacity search grows
    Criteo's cardinalities), then cut to at most ``max_rows`` rows (None: no cap)."""
    from merlin.schema import Schema, Tags

    if not max_rows and scale == 1.0:
        return schema
    cols = []
    for col in schema:
        if Tags.CATEGORICAL in col.tags and col.int_domain is not None:
            # at least 2 rows: a table needs an id beyond Merlin's reserved 0
            rows = max(2, round((int(col.int_domain.max) + 1) * scale))
            domain = {"min": 0, "max": min(rows, max_rows or rows) - 1}
            if col.int_domain.name:
                domain["name"] = col.int_domain.name
            col = col.with_properties({**col.properties, "domain": domain})
        cols.append(col)
    return Schema(cols)
