"""A Faiss index of an item table, filled in batches from the parallel table export.

Every training rank writes its own rows (``merlin_models_de.export_table``); here one
serving process reads them back with ``iter_table`` one batch at a time and adds each batch
to the index, so no training process ever holds the whole table, and this one holds the
index plus one batch. Row i of the table is item id i, which is what Faiss returns.

``factory="Flat"`` (default) is exact inner-product search. For 10M+ items pick an
approximate one, e.g. ``"IVF4096,Flat"`` or ``"IVF16384,PQ32"``: such an index is trained
first, on the first ``train_rows`` rows read (a sample of at least ~40 rows per list), then
filled in batches as the exact one; set ``nprobe`` at query time (``faiss.ParameterSpace``)
to trade recall for speed.

Example:
    >>> build_faiss_index("tables/item_id", "items.faiss")  # doctest: +SKIP
"""

from __future__ import annotations

import os

import numpy as np


def build_faiss_index(
    table_dir: str,
    index_path: str,
    batch_rows: int = 65536,
    factory: str = "Flat",
    train_rows: int = 262144,
) -> int:
    """Writes a Faiss inner-product index of the table in ``table_dir`` to ``index_path``;
    returns the number of rows added (the table's rows)."""
    import faiss

    from merlin_models_de.persistence.table_export import iter_table, read_manifest

    manifest = read_manifest(table_dir)
    rows, dim = manifest["rows"], manifest["dim"]
    index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        sample = np.concatenate(
            [v for _, v in _first_rows(iter_table(table_dir, batch_rows), min(train_rows, rows))]
        )
        index.train(np.ascontiguousarray(sample, np.float32))
    added = 0
    for first, vectors in iter_table(table_dir, batch_rows):
        if first != added:
            raise ValueError(
                f"Table {table_dir!r} read out of order: batch at row {first}, expected {added}"
            )
        index.add(np.ascontiguousarray(vectors, np.float32))
        added += len(vectors)
    if added != rows:
        raise ValueError(
            f"Table {table_dir!r} has {rows} rows in its manifest but {added} were read"
        )
    os.makedirs(os.path.dirname(os.path.abspath(index_path)), exist_ok=True)
    faiss.write_index(index, index_path)
    return added


def _first_rows(batches, rows: int):
    taken = 0
    for first, vectors in batches:
        if taken >= rows:
            return
        yield first, vectors[: rows - taken]
        taken += len(vectors)


__all__ = ["build_faiss_index"]
