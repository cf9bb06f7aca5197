"""The ranking ensemble serves a model with dynamic tables on raw rows, in one process: an
NVTabular workflow that keeps raw integer item ids (``AddTags``, no ``Categorify``) and
hashes string user ids by value (``ValueHashBucket(2**62)``), a DLRM whose ``item_id`` and
``user_id`` tables are dynamic, ``model.save``, then ``ranking_ensemble`` on raw rows: it
equals ``model.predict``, and keys training never saw read the default row (docs/dynamic.md,
docs/serving.md)."""

import os

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("nvtabular")
pytest.importorskip("merlin.systems")

import merlin.models.tf as mm  # noqa: E402

pytestmark = pytest.mark.full  # ~60 s of one core: a workflow fit, training, a save, a load

FIRST_KEY = 10**12  # raw item ids far beyond any vocabulary


def raw_rows(rng, rows, items, users):
    return pd.DataFrame(
        {
            "item_id": (FIRST_KEY + rng.integers(0, items, rows)).astype(np.int64),
            "user_id": [f"u{u}" for u in rng.integers(0, users, rows)],
            "category": [f"c{c}" for c in rng.integers(0, 5, rows)],
            "price": rng.random(rows) * 10,
            "click": (rng.random(rows) < 0.4).astype(np.float32),
        }
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(root, raw validation rows without the label, the trained model, its ensemble):
    validation draws from twice the items and users training saw."""
    import nvtabular as nvt
    from merlin.io import Dataset
    from merlin.schema import Tags

    from merlin_models_de import DynamicTable
    from merlin_models_de.serving.ensemble import ranking_ensemble
    from merlin_models_de.serving.hashing import ValueHashBucket

    root = tmp_path_factory.mktemp("dynamic_serving")
    rng = np.random.default_rng(0)
    train, valid = raw_rows(rng, 512, 60, 40), raw_rows(rng, 64, 120, 80)
    workflow = nvt.Workflow(
        (["item_id"] >> nvt.ops.AddTags([Tags.CATEGORICAL, Tags.ITEM_ID]))
        + (["user_id"] >> ValueHashBucket(2**62) >> nvt.ops.AddTags([Tags.USER_ID]))
        + (["category"] >> nvt.ops.Categorify(out_path=str(root / "categories")))
        + (["price"] >> nvt.ops.Normalize())
        + (["click"] >> nvt.ops.AddTags([Tags.TARGET, Tags.BINARY_CLASSIFICATION]))
    )
    workflow.fit(Dataset(train))
    workflow.save(str(root / "workflow"))
    features = workflow.transform(Dataset(train))
    schema = features.schema
    embeddings = mm.DistributedEmbeddings(
        schema.select_by_tag(Tags.CATEGORICAL),
        dim=4,
        dynamic_tables={
            "item_id": DynamicTable(capacity=200),
            "user_id": DynamicTable(capacity=200),
        },
    )
    model = mm.DLRMModel(
        schema,
        embeddings=embeddings,
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryClassificationTask("click"),
    )
    model.compile(optimizer="adagrad")
    model.fit(mm.Loader(features, batch_size=64, shuffle=False), epochs=1, verbose=0)
    model.save(str(root / "model"))
    ensemble = ranking_ensemble(root / "workflow", root / "model", label_columns=["click"])
    return root, valid.drop(columns=["click"]), model, ensemble


def predicted(model, root, rows):
    """``model.predict`` on raw ``rows`` through the served workflow (Merlin's loader)."""
    from merlin.io import Dataset

    from merlin_models_de.serving.ensemble import serving_workflow

    workflow = serving_workflow(root / "workflow", ["click"])
    features = workflow.transform(Dataset(rows.reset_index(drop=True)))
    want = model.predict(mm.Loader(features, batch_size=64, shuffle=False), verbose=0)
    if isinstance(want, dict):  # Merlin predicts {task: scores}
        (want,) = want.values()
    return np.asarray(want).reshape(-1)


def scores(ensemble, rows):
    from merlin_models_de.serving.ensemble import column_array

    (name,) = ensemble.output_schema.column_names
    return column_array(ensemble.transform(rows.reset_index(drop=True)), name).reshape(-1)


def test_the_workflow_keeps_raw_item_keys_and_hashes_users_by_value(served):
    from merlin.io import Dataset

    from merlin_models_de.serving.ensemble import serving_workflow
    from merlin_models_de.serving.hashing import bucket_ids

    root, raw, _, _ = served
    workflow = serving_workflow(root / "workflow", ["click"])
    out = workflow.transform(Dataset(raw)).to_ddf().compute()
    np.testing.assert_array_equal(out["item_id"].to_numpy(), raw["item_id"].to_numpy())
    # each user's key is a hash of its value alone: the same in any row or batch
    np.testing.assert_array_equal(out["user_id"].to_numpy(), bucket_ids(raw["user_id"], 2**62))
    alone = workflow.transform(Dataset(raw.iloc[[5]].reset_index(drop=True))).to_ddf().compute()
    assert alone["user_id"].iloc[0] == out["user_id"].iloc[5]
    assert out["user_id"].nunique() == raw["user_id"].nunique()  # no two users share a key


def test_the_ensemble_serves_dynamic_tables_on_raw_rows_as_model_predict(served, tmp_path):
    """Raw rows (half their items and users never trained) through the ensemble equal
    ``model.predict``, in a batch and one row alone; the ensemble exports for Triton."""
    from merlin_models_de.serving.ensemble import ranking_ensemble
    from merlin_models_de.variables import embedding_blocks

    root, raw, model, ensemble = served
    (block,) = embedding_blocks(model)
    trained, _ = block.dynamic_table("item_id")
    unseen = ~raw["item_id"].isin(trained)
    assert 10 < unseen.sum() < len(raw) - 10, unseen.sum()
    got, want = scores(ensemble, raw), predicted(model, root, raw)
    assert got.shape == (len(raw),)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    first_unseen = int(np.flatnonzero(unseen.to_numpy())[0])
    np.testing.assert_allclose(
        scores(ensemble, raw.iloc[[first_unseen]]), want[[first_unseen]], rtol=1e-6, atol=1e-6
    )
    # Ensemble.export swaps the graph's operators for Triton's: a copy of its own exports
    ranking_ensemble(root / "workflow", root / "model", ["click"]).export(str(tmp_path / "triton"))
    saved = tmp_path / "triton/1_predicttensorflowtriton/1/model.savedmodel"
    assert os.path.isdir(saved), sorted(os.listdir(tmp_path / "triton"))


def test_keys_never_trained_read_the_default_row(served):
    """One row repeated with item ids training never saw scores the same for each of them
    (each reads the item table's default row), and differently with a trained item id."""
    from merlin_models_de.variables import embedding_blocks

    root, raw, model, ensemble = served
    (block,) = embedding_blocks(model)
    trained, _ = block.dynamic_table("item_id")
    new_keys = np.array([FIRST_KEY + 10**6, FIRST_KEY + 10**6 + 1, 7, 2**62], np.int64)
    assert not np.isin(new_keys, trained).any()
    rows = pd.concat([raw.iloc[[0]]] * 5).assign(item_id=np.append(new_keys, trained[0]))
    got = scores(ensemble, rows)
    np.testing.assert_allclose(got, predicted(model, root, rows), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[:4], np.full(4, got[0]), rtol=0, atol=1e-7)
    assert abs(got[4] - got[0]) > 1e-6, got
