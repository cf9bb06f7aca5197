"""The data rules of fit / evaluate / predict on 2 ranks, with a real one-file Merlin Dataset
and a real mm.Loader: fewer partitions than ranks, or a short last batch without drop_last,
raise one clear error on every rank before any step (never a bare IndexError), the fix the
message names works, and a Dataset given to the methods themselves is read under the rules."""

import pytest
import tensorflow as tf

from merlin_models_de import comm
from tests.ranks import oracle_dlrm

ROWS = 101  # repartitioned in two: 50 and 51 rows, short last batches of 2 and 3 at batch 16
BATCH = 16


def still_in_step():
    """A collective after the error: proves the ranks did not drift apart or hang."""
    assert comm.allreduce(tf.constant(1.0), op="sum").numpy() == comm.size()


@pytest.fixture(scope="module")
def one_file_dataset(tmp_path_factory):
    """A Merlin Dataset over one parquet file (one partition), the same rows on every rank."""
    from merlin.datasets.synthetic import generate_data
    from merlin.io import Dataset

    schema = oracle_dlrm.schema()
    path = tmp_path_factory.mktemp(f"one_file_r{comm.rank()}")
    generate_data(schema, ROWS).to_ddf().compute().to_parquet(path / "part.0.parquet")
    return Dataset(str(path), engine="parquet", schema=schema)


@pytest.fixture(scope="module")
def model():
    built = oracle_dlrm.build_model({"strategy": "basic"})
    built.compile(optimizer="sgd")
    return built


def calls(model, data, **kwargs):
    return {
        "fit": lambda: model.fit(data, verbose=0, **kwargs),
        "evaluate": lambda: model.evaluate(data, verbose=0, **kwargs),
        "predict": lambda: model.predict(data, verbose=0, **kwargs),
    }


@pytest.mark.parametrize("drop_last", [True, False])
def test_one_partition_for_two_ranks_names_repartition_and_drop_last(
    hvd, model, one_file_dataset, drop_last
):
    import merlin.models.tf as mm

    assert one_file_dataset.npartitions == 1
    loader = mm.Loader(one_file_dataset, batch_size=BATCH, drop_last=drop_last)
    for method, call in calls(model, loader).items():
        with pytest.raises(
            ValueError,
            match=(
                rf"^{method}: the dataset has 1 partition\(s\) for 2 ranks.*"
                r"ds = ds\.repartition\(npartitions=2\).*drop_last=True"
            ),
        ):
            call()
        still_in_step()


def test_a_dataset_given_to_the_methods_is_read_under_the_data_rules(
    hvd, model, one_file_dataset, capfd
):
    """fit / evaluate / predict(ds, batch_size=B): Merlin would make the Loader itself from
    the one partition; it is repartitioned to one a rank and read with drop_last=True
    (rank 0 says so once), so each rank runs 50 // 16 = 51 // 16 = 3 equal batches."""
    history = model.fit(
        one_file_dataset, batch_size=BATCH, verbose=0, validation_data=one_file_dataset
    )
    assert len(history.history["loss"]) == len(history.history["val_loss"]) == 1
    assert set(model.evaluate(one_file_dataset, batch_size=BATCH, verbose=0, return_dict=True)) >= {
        "loss"
    }
    assert model.predict(one_file_dataset, batch_size=BATCH).shape == (3 * BATCH, 1)
    err = capfd.readouterr().err
    said = (
        "repartitioned the Merlin Dataset's 1 partition(s) to 2 (Merlin's Loader gives "
        "each rank whole partitions) and read it with drop_last=True"
    )
    for method in ("fit", "evaluate", "predict"):
        assert err.count(f"{method}: for 2 ranks, {said}") == (1 if comm.rank() == 0 else 0)
    still_in_step()


def test_a_dataset_given_with_drop_last_false_names_the_short_batches(hvd, model, one_file_dataset):
    for method, call in calls(model, one_file_dataset, batch_size=BATCH, drop_last=False).items():
        given = "steps_per_epoch" if method == "fit" else "steps"
        with pytest.raises(
            ValueError,
            match=(
                rf"^{method}: the ranks' last batches differ in size.*"
                r"\{0: 2, 1: 3\}.*"
                rf"{given}=3"
            ),
        ):
            call()
    still_in_step()


def test_a_short_last_batch_of_another_size_names_drop_last(hvd, model, one_file_dataset):
    import merlin.models.tf as mm

    loader = mm.Loader(one_file_dataset.repartition(npartitions=2), batch_size=BATCH)
    for method, call in calls(model, loader).items():
        given = "steps_per_epoch" if method == "fit" else "steps"
        with pytest.raises(
            ValueError,
            match=(
                rf"^{method}: the ranks' last batches differ in size.*"
                r"\{0: 2, 1: 3\}.*drop_last=True.*"
                rf"{given}=3"
            ),
        ):
            call()
    still_in_step()


def test_the_fix_the_message_names_runs(hvd, model, one_file_dataset):
    import merlin.models.tf as mm

    loader = mm.Loader(
        one_file_dataset.repartition(npartitions=2), batch_size=BATCH, drop_last=True
    )
    history = model.fit(loader, verbose=0)
    assert len(history.history["loss"]) == 1
    assert set(model.evaluate(loader, verbose=0, return_dict=True)) >= {"loss"}
    assert model.predict(loader, verbose=0).shape == (3 * BATCH, 1)
    still_in_step()
