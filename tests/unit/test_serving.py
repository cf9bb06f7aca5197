"""The user's path on small data, in one process: raw rows -> NVTabular (examples/) -> the
block's tables -> a saved model -> Merlin Systems ensembles on raw rows (docs/nvtabular.md,
docs/serving.md). The 2-rank half is tests/unit/horovod/test_examples.py."""
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("nvtabular")
pytest.importorskip("merlin.systems")
pytest.importorskip("faiss")

import merlin.models.tf as mm  # noqa: E402
import tensorflow as tf  # noqa: E402

from examples import preprocess, raw_data, train_next_item  # noqa: E402


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """examples/raw_data.py and examples/preprocess.py on a small log and few sessions."""
    root = tmp_path_factory.mktemp("path")
    raw_data.write(str(root / "raw"), rows=800, sessions=160, seed=3)
    preprocess.main([str(root / "raw"), str(root / "nvt")])
    return root


def frame(directory):
    from merlin.io import Dataset

    return Dataset(str(directory), engine="parquet").to_ddf().compute().reset_index(drop=True)


def test_workflow_output_gives_the_block_its_tables_and_the_special_ids(out):
    from merlin.io import Dataset

    from merlin_models_de import DistributedEmbeddings

    schema = Dataset(str(out / "nvt/clicks/train"), engine="parquet").schema
    block = DistributedEmbeddings(schema.excluding_by_tag("target"), dim=4)
    rows = {t.name: t.rows for t in block.tables}
    assert rows == {c.name: c.int_domain.max + 1
                    for c in schema.select_by_tag("categorical")}
    raw_train = pd.read_parquet(out / "raw/clicks/train.parquet")
    # padding 0, null 1, OOV 2, then the vocabulary, capped by max_size
    assert rows["item_id"] == min(400, 3 + raw_train["item_id"].nunique())
    assert 2 + 16 < rows["category"] <= 120  # 16 hashed OOV buckets from id 2
    raw = pd.read_parquet(out / "raw/clicks/valid.parquet")
    valid = frame(out / "nvt/clicks/valid")
    assert len(valid) == len(raw)
    seen = set(raw_train["user_id"].dropna())
    # row order is kept by the workflow: compare raw values with their ids
    assert (valid["user_id"][raw["user_id"].isna().to_numpy()] == 1).all()  # null -> 1
    unseen = raw["user_id"].notna() & ~raw["user_id"].isin(seen)
    assert unseen.any() and (valid["user_id"][unseen.to_numpy()] == 2).all()  # OOV -> 2
    assert (valid["device"][raw["device"].isna().to_numpy()] == 1).all()
    # hashed OOV buckets 2..17, the vocabulary after them; nothing reads padding 0
    categories = valid["category"].to_numpy()
    assert categories.min() >= 2 and categories.max() < 120
    assert 0 not in np.concatenate(valid["tags"].to_numpy())

    sessions = frame(out / "nvt/sessions/train")
    lengths = sessions["item_id"].map(len)
    assert lengths.max() <= 20 and lengths.min() >= 2
    item = Dataset(str(out / "nvt/sessions/train"), engine="parquet").schema["item_id"]
    assert {"item", "id", "list"} <= {t.value for t in item.tags}


def test_ranking_ensemble_on_raw_rows_predicts_as_the_model(out, tmp_path):
    """The DLRM command's --export (docs/nvtabular.md, section 3) served on raw rows."""
    from merlin.io import Dataset

    from merlin_models_de.serving.ensemble import column_array, load_model, ranking_ensemble

    run = subprocess.run(
        [sys.executable, "-m", "merlin_models_de.apps.dlrm", "--train-dir",
         str(out / "nvt/clicks/train"), "--batch-size", "64", "--epochs", "1", "--dim", "4",
         "--bottom-mlp", "4", "--top-mlp", "4", "--quiet", "--export", str(tmp_path / "model")],
        capture_output=True, text=True, timeout=600, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    loaded = load_model(tmp_path / "model")
    valid = Dataset(str(out / "nvt/clicks/valid"), engine="parquet")
    want = loaded.predict(mm.Loader(valid, batch_size=50, shuffle=False), verbose=0)
    if isinstance(want, dict):  # Merlin predicts {task: scores}
        (want,) = want.values()
    raw = pd.read_parquet(out / "raw/clicks/valid.parquet").drop(columns=["click"])
    ensemble = ranking_ensemble(out / "nvt/clicks/workflow", tmp_path / "model",
                                label_columns=["click"])
    served = ensemble.transform(raw)
    (name,) = ensemble.output_schema.column_names
    got = column_array(served, name).reshape(-1)
    assert got.shape == (len(raw),)
    want = np.asarray(want).reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    print(f"max |served - model.predict| = {np.max(np.abs(got - want)):.3g}")

    ensemble.export(str(tmp_path / "triton"))
    repo = sorted(os.listdir(tmp_path / "triton"))
    assert repo == ["0_transformworkflowtriton", "1_predicttensorflowtriton", "executor_model"]
    for model_dir in repo:
        assert os.path.isfile(tmp_path / "triton" / model_dir / "config.pbtxt")
        assert os.path.isdir(tmp_path / "triton" / model_dir / "1")
    assert os.path.isdir(tmp_path / "triton/1_predicttensorflowtriton/1/model.savedmodel")


@pytest.mark.full  # an ensemble on raw rows: the ranking test above
def test_retrieval_ensemble_on_raw_sessions_gives_the_models_top_k(out, tmp_path):
    from merlin.io import Dataset

    from merlin_models_de import export_table, top_k_model
    from merlin_models_de.serving.ensemble import column_array, load_model, load_workflow
    from merlin_models_de.serving.faiss_index import build_faiss_index
    from merlin_models_de.serving.retrieval import retrieval_ensemble, save_query_model

    train = Dataset(str(out / "nvt/sessions/train"), engine="parquet")
    schema = train.schema.select_by_name(["item_id"])
    tf.keras.utils.set_random_seed(4)
    model, block = train_next_item.build_model(schema, dim=8)
    # untrained: its random tables rank the items differently for every session
    loader = mm.Loader(Dataset(str(out / "nvt/sessions/train"), engine="parquet",
                               schema=schema), batch_size=16)
    model(next(iter(loader))[0])
    model.save(str(tmp_path / "model"))
    export_table(block, "item_id", str(tmp_path / "items"))

    loaded = load_model(tmp_path / "model")
    save_query_model(loaded, str(tmp_path / "query"), out / "nvt/sessions/workflow")
    rows = build_faiss_index(str(tmp_path / "items"), str(tmp_path / "items.faiss"),
                             batch_rows=37)
    assert rows == schema["item_id"].int_domain.max + 1
    k = 5
    ensemble = retrieval_ensemble(out / "nvt/sessions/workflow", tmp_path / "query",
                                  tmp_path / "items.faiss", k=k)
    events = pd.read_parquet(out / "raw/events/valid.parquet")
    served = column_array(ensemble.transform(events), "candidate_ids").reshape(-1, k)

    sessions = load_workflow(out / "nvt/sessions/workflow").transform(
        Dataset(events)).to_ddf().compute()
    seq = tf.ragged.constant(sessions["item_id"].tolist(), dtype=tf.int64)
    _, want = top_k_model(loaded, k=k)({"item_id__values": seq.flat_values,
                                        "item_id__offsets": seq.row_splits})
    assert served.shape == (len(sessions), k)
    assert len({tuple(r) for r in served}) > 1  # sessions get different items
    np.testing.assert_array_equal(served, want.numpy())
