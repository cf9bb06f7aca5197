"""merlin_models_de.loader_dataset: the batches mm.Loader gives each rank (same keys, dtypes,
shapes and values, a partition's remainder carried into the next batch), cut natively."""

import numpy as np
import pytest

from merlin_models_de.merlin.input import loader_dataset, rank_partitions


def criteo(rows, partitions):
    from merlin.datasets.synthetic import generate_data

    return generate_data("criteo", rows).repartition(npartitions=partitions)


def assert_same_batches(want, got):
    assert len(got) == len(want)
    for (want_x, want_y), (got_x, got_y) in zip(want, got):
        assert list(got_x) == list(want_x)
        for key, value in want_x.items():
            assert (got_x[key].dtype, got_x[key].shape) == (value.dtype, value.shape), key
            np.testing.assert_array_equal(got_x[key].numpy(), value.numpy())
        assert (got_y.dtype, got_y.shape) == (want_y.dtype, want_y.shape)
        np.testing.assert_array_equal(got_y.numpy(), want_y.numpy())


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("drop_last", [True, False])
def test_each_rank_gets_the_loaders_batches(rank, drop_last):
    import merlin.models.tf as mm

    ds = criteo(1000, 3)  # uneven: rank 0 reads two partitions, rank 1 one
    loader = mm.Loader(
        ds, batch_size=64, shuffle=False, drop_last=drop_last, global_size=2, global_rank=rank
    )
    want = list(loader)
    data = loader_dataset(ds, 64, drop_last=drop_last, rank=rank, world_size=2)
    assert int(data.cardinality()) == len(want)
    assert_same_batches(want, list(data))


def test_partitions_per_rank_follow_the_loader():
    assert rank_partitions(5, 0, 2) == [0, 1, 2]
    assert rank_partitions(5, 1, 2) == [3, 4]
    assert rank_partitions(2, 1, 2) == [1]


def test_fewer_partitions_than_ranks_names_the_fix():
    with pytest.raises(
        ValueError, match=r"1 partition\(s\) for 2 ranks.*ds\.repartition\(npartitions=2\)"
    ):
        loader_dataset(criteo(100, 1), 16, rank=0, world_size=2)


def test_bad_batch_size_and_list_columns_are_named():
    from merlin.datasets.synthetic import generate_data

    with pytest.raises(
        ValueError, match=r"batch_size must be a positive int. Received: batch_size=0"
    ):
        loader_dataset(criteo(100, 1), 0, rank=0, world_size=1)
    sequences = generate_data("sequence-testing", 100)
    with pytest.raises(ValueError, match=r"scalar columns only; list columns \[.*item_id_seq"):
        loader_dataset(sequences, 16, rank=0, world_size=1)
