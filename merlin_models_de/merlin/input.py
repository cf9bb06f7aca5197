"""A native ``tf.data`` input over a Merlin ``Dataset``: the batches ``mm.Loader`` gives this
rank, cut by TensorFlow instead of Python.

Keras feeds a ``mm.Loader`` (a ``keras.utils.Sequence``) through a Python generator: every
batch converts each column (DLPack) and crosses the GIL, a few milliseconds per step that on N
ranks of one host compete with the ranks' compute. Here Python touches one *partition* at a
time (its columns as NumPy arrays), and ``Dataset.rebatch`` cuts the batches in C++, carrying
a partition's remainder into the next one exactly as the loader does. The result is the same
sequence of batches, with the same keys, dtypes and shapes (scalar columns ``[B]``; one target:
a tensor, several: a dict), for scalar columns; list columns keep using ``mm.Loader``.

Example:
    >>> train = loader_dataset(Dataset(path), batch_size=512)  # doctest: +SKIP
    >>> model.fit(train, epochs=2)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import sys

from merlin_models_de import comm
from merlin_models_de.compat.tf_data import generator_dataset


def rank_partitions(npartitions: int, rank: int, world_size: int) -> list:
    """The partitions Merlin's loader reads on rank ``rank`` of ``world_size``:
    contiguous runs of ``ceil(P / N)``; at least one partition a rank."""
    if npartitions < world_size:
        raise ValueError(
            f"The dataset has {npartitions} partition(s) for {world_size} ranks: every rank "
            f"reads whole partitions. Repartition it: ds = ds.repartition(npartitions="
            f"{world_size})"
        )
    per_rank = math.ceil(npartitions / world_size)
    return list(range(npartitions))[rank * per_rank : (rank + 1) * per_rank]


def loader_dataset(
    dataset,
    batch_size: int,
    drop_last: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    prefetch: int = 2,
):
    """``tf.data.Dataset`` of ``(features, targets)``: this rank's batches of ``dataset``, as
    ``mm.Loader(dataset, batch_size, shuffle=False, drop_last=drop_last)`` gives them under
    horovodrun (``rank`` / ``world_size``: the launch's by default; pass ``world_size=1`` for
    a dataset that holds this rank's rows only). Its cardinality is known, so ``fit`` checks
    that every rank runs the same number of steps."""
    tf = comm.tf
    from merlin.schema import Tags

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int. Received: batch_size={batch_size!r}")
    rank = comm.rank() if rank is None else rank
    world_size = comm.size() if world_size is None else world_size
    schema = dataset.schema
    lists = [c.name for c in schema if c.is_list]
    if lists:
        raise ValueError(
            f"loader_dataset takes scalar columns only; list columns {lists} "
            "keep using mm.Loader(dataset, batch_size, drop_last=True)."
        )
    columns = schema.column_names
    targets = schema.select_by_tag(Tags.TARGET).column_names
    indices = rank_partitions(dataset.npartitions, rank, world_size)
    rows = len(dataset.to_iter(columns=columns, indices=indices))
    steps = rows // batch_size if drop_last else math.ceil(rows / batch_size)
    dtypes = dataset.to_ddf(columns=columns).dtypes

    def partitions():
        for frame in dataset.to_iter(columns=columns, indices=indices):
            yield {c: frame[c].to_numpy() for c in columns}

    signature = {c: tf.TensorSpec([None], tf.as_dtype(dtypes[c])) for c in columns}

    def split(batch):
        features = {c: batch[c] for c in columns if c not in targets}
        if not targets:
            return features
        if len(targets) == 1:
            return features, batch[targets[0]]
        return features, {t: batch[t] for t in targets}

    data = generator_dataset(partitions, signature)  # logs nothing at each iterator's start
    data = data.rebatch(batch_size, drop_remainder=drop_last).map(split)
    return data.apply(tf.data.experimental.assert_cardinality(steps)).prefetch(prefetch)


_said: set = set()


def rank_loader(method: str, data, batch_size, shuffle: bool, loader_kwargs: dict):
    """The ``mm.Loader`` that ``fit`` / ``evaluate`` / ``predict`` make from a Merlin
    ``Dataset`` given to them (Merlin makes it inside the method, too late for the batch
    checks), made under the data rules: fewer partitions than ranks are repartitioned to one
    a rank, and ``drop_last`` is True unless given. Rank 0 says so once. Other data, or no
    ``batch_size`` (Merlin names that), is returned as it is."""
    import merlin.models.tf as mm
    from merlin.io import Dataset

    if not isinstance(data, Dataset) or batch_size is None:
        return data
    ranks, done = comm.size(), []
    if data.npartitions < ranks:
        done.append(
            f"repartitioned the Merlin Dataset's {data.npartitions} partition(s) to "
            f"{ranks} (Merlin's Loader gives each rank whole partitions)"
        )
        data = data.repartition(npartitions=ranks)
    kwargs = dict(loader_kwargs)
    if kwargs.get("drop_last") is None:
        done.append(
            ("read it" if done else "read the Merlin Dataset") + " with "
            "drop_last=True (every rank runs the same number of equal batches)"
        )
        kwargs["drop_last"] = True
    said = f"{method}: for {ranks} ranks, " + " and ".join(done) + "."
    if done and comm.rank() == 0 and said not in _said:
        _said.add(said)
        print(f"[merlin_models_de] {said}", file=sys.stderr, flush=True)
    return mm.Loader(data, batch_size=batch_size, shuffle=shuffle, **kwargs)


__all__ = ["loader_dataset", "rank_loader", "rank_partitions"]
