"""The user's path on small data, in one process: raw rows -> NVTabular (examples/) -> the
block's tables -> a saved model -> Merlin Systems ensembles on raw rows (docs/nvtabular.md,
docs/serving.md). The 2-rank half is tests/ranks/test_examples.py."""

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

QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """examples/raw_data.py and examples/preprocess.py on a small log and few sessions."""
    root = tmp_path_factory.mktemp("path")
    raw_data.write(str(root / "raw"), rows=800, sessions=160, seed=3)
    preprocess.main([str(root / "raw"), str(root / "nvt")])
    return root


@pytest.fixture(scope="module")
def ranking(out, tmp_path_factory):
    """The DLRM command's --export (docs/nvtabular.md, section 3) trained on the click
    workflow's output: (model directory, the loaded model, its ensemble). The tests that
    export build their own ensemble (``Ensemble.export`` swaps the graph's operators)."""
    from merlin_models_de.serving.ensemble import load_model, ranking_ensemble

    model_dir = tmp_path_factory.mktemp("dlrm") / "model"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "merlin_models_de.apps.dlrm",
            "--train-dir",
            str(out / "nvt/clicks/train"),
            "--batch-size",
            "64",
            "--epochs",
            "1",
            "--dim",
            "4",
            "--bottom-mlp",
            "4",
            "--top-mlp",
            "4",
            "--quiet",
            "--export",
            str(model_dir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=QUIET,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ensemble = ranking_ensemble(out / "nvt/clicks/workflow", model_dir, label_columns=["click"])
    return model_dir, load_model(model_dir), ensemble


def raw_clicks(out):
    return pd.read_parquet(out / "raw/clicks/valid.parquet").drop(columns=["click"])


def predict(model, out, rows):
    """``model.predict`` on raw ``rows`` through the click workflow (Merlin's loader)."""
    from merlin.io import Dataset

    from merlin_models_de.serving.ensemble import serving_workflow

    workflow = serving_workflow(out / "nvt/clicks/workflow", ["click"])
    features = workflow.transform(Dataset(rows.reset_index(drop=True)))
    want = model.predict(mm.Loader(features, batch_size=1024, shuffle=False), verbose=0)
    if isinstance(want, dict):  # Merlin predicts {task: scores}
        (want,) = want.values()
    return np.asarray(want).reshape(-1)


def served(ensemble, rows):
    from merlin_models_de.serving.ensemble import column_array

    (name,) = ensemble.output_schema.column_names
    return column_array(ensemble.transform(rows), name).reshape(-1)


def frame(directory):
    from merlin.io import Dataset

    return Dataset(str(directory), engine="parquet").to_ddf().compute().reset_index(drop=True)


def test_workflow_output_gives_the_block_its_tables_and_the_special_ids(out):
    from merlin.io import Dataset

    from merlin_models_de import DistributedEmbeddings

    schema = Dataset(str(out / "nvt/clicks/train"), engine="parquet").schema
    block = DistributedEmbeddings(schema.excluding_by_tag("target"), dim=4)
    rows = {t.name: t.rows for t in block.tables}
    assert rows == {c.name: c.int_domain.max + 1 for c in schema.select_by_tag("categorical")}
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
    lengths = sessions["item_id_list"].map(len)
    assert lengths.max() <= 20 and lengths.min() >= 2
    assert (sessions["item_id_count"] >= lengths).all()  # counted before the cut to 20
    schema = Dataset(str(out / "nvt/sessions/train"), engine="parquet").schema
    assert {"item", "id", "list"} <= {t.value for t in schema["item_id_list"].tags}
    assert train_next_item.item_column(schema) == "item_id_list"  # not the tagged count


def test_ranking_ensemble_serves_the_workflow_as_fitted_and_predicts_as_the_model(
    out, ranking, tmp_path
):
    """The click workflow writes float64 continuous columns (FillMissing >> LogOp >>
    Normalize, NVTabular's defaults); the model's signature takes float32: the ensemble
    casts between the workflow and the model."""
    from merlin_models_de.serving.ensemble import load_workflow, ranking_ensemble

    model_dir, model, _ = ranking
    written = load_workflow(out / "nvt/clicks/workflow").output_schema
    assert {written[c].dtype.name for c in ("price", "age")} == {"float64"}
    raw = raw_clicks(out)
    ensemble = ranking_ensemble(out / "nvt/clicks/workflow", model_dir, label_columns=["click"])
    got, want = served(ensemble, raw), predict(model, out, raw)
    assert got.shape == (len(raw),)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    print(f"max |served - model.predict| = {np.max(np.abs(got - want)):.3g}")

    ensemble.export(str(tmp_path / "triton"))
    repo = sorted(os.listdir(tmp_path / "triton"))
    assert repo == ["0_transformworkflowtriton", "1_predicttensorflowtriton", "executor_model"]
    for model_dir in repo:
        assert os.path.isfile(tmp_path / "triton" / model_dir / "config.pbtxt")
        assert os.path.isdir(tmp_path / "triton" / model_dir / "1")
    assert os.path.isdir(tmp_path / "triton/1_predicttensorflowtriton/1/model.savedmodel")
    check_without_this_package(tmp_path / "triton/executor_model/1/ensemble", out)


# Triton's executor unpickles the ensemble (Ensemble.load) in its own Python: the request
# check and the casting operator come by value, this package is not importable there
WITHOUT_THIS_PACKAGE = """
import sys
sys.modules["merlin_models_de"] = None  # any import of the package raises ImportError
import pandas as pd
from merlin.systems.dag import Ensemble

ensemble = Ensemble.load(sys.argv[1])
print(sorted(type(n.op).__name__ for n in ensemble.graph.output_node.parents_with_dependencies))
try:
    ensemble.transform(pd.read_parquet(sys.argv[2]).drop(columns=["click", "age"]))
except ValueError as error:
    print(type(error).__name__, error)
"""


def check_without_this_package(ensemble_dir, out):
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_THIS_PACKAGE,
            str(ensemble_dir),
            str(out / "raw/clicks/valid.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=QUIET,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[-2] == "['ModelInputs']"  # what feeds the model
    assert lines[-1].startswith(
        "RequestError Request is missing columns the workflow reads: age (float (float64))"
    ), run.stdout


def test_ranking_ensemble_serves_rows_whose_list_is_empty(out, ranking):
    """A request whose list column (tags) is empty in every row reaches the model as float64
    values of shape (0,) from the workflow: served as model.predict serves those rows in a
    batch with others (Merlin's loader cannot batch only empty lists)."""
    _, model, ensemble = ranking
    raw = raw_clicks(out)
    empty = raw.iloc[:3].assign(tags=[[], [], []])
    want = predict(model, out, pd.concat([empty, raw.iloc[3:40]]))
    np.testing.assert_allclose(served(ensemble, empty.iloc[[0]]), want[:1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served(ensemble, empty), want[:3], rtol=1e-6, atol=1e-6)
    # and the same rows mixed with tagged ones
    np.testing.assert_allclose(
        served(ensemble, pd.concat([empty, raw.iloc[3:40]])), want, rtol=1e-6, atol=1e-6
    )


def test_a_bad_request_names_the_column_the_expected_and_the_received_type(out, ranking):
    from merlin_models_de.serving.request import RequestError

    _, model, ensemble = ranking
    raw = raw_clicks(out).iloc[:20].reset_index(drop=True)
    bad = {
        r"missing columns the workflow reads: age \(float \(float64\)\)\. Received columns: "
        r"\['category', 'device', 'item_id', 'price', 'tags', 'user_id'\]": raw.drop(
            columns=["age"]
        ),
        r"missing columns the workflow reads: user_id \(string \(object\)\), item_id": pd.DataFrame(),
        r"has no rows": raw.iloc[:0],
        r"column 'user_id': expected string \(object\), received integer \(int64\)": raw.assign(
            user_id=np.arange(len(raw))
        ),
        r"column 'tags': expected lists of string \(object\), received string \(object\)": raw.assign(
            tags="t1"
        ),
        r"column 'price': expected float \(float64\), received string \(object\)": raw.assign(
            price="12.5"
        ),
    }
    for message, request in bad.items():
        with pytest.raises(RequestError, match=message):
            ensemble.transform(request)
    # what the check lets through: ints where floats are read, a null among values, and a
    # one-row request whose categorical is null (NVTabular's Categorify cannot encode a
    # batch of nulls alone; the ensemble serves it as the null id)
    fine = raw.assign(age=30, device=[None] + list(raw["device"][1:]))
    want = predict(model, out, fine)
    np.testing.assert_allclose(served(ensemble, fine), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served(ensemble, fine.iloc[:1]), want[:1], rtol=1e-6, atol=1e-6)


@pytest.mark.full  # 94 s; CI serves retrieval queries in test_serving_retrieval.py
def test_retrieval_ensemble_on_a_session_workflow_with_scalars_gives_the_models_top_k(
    out, tmp_path
):
    """examples/train_next_item.py on the session workflow as Groupby writes it (session_id
    and item_id_count beside the item list; the table named item_id, the feature
    item_id_list), served as retrieval: the top-10 equals the model's own, whether the query
    model's signature takes the workflow's columns or only its own."""
    from merlin.io import Dataset

    from merlin_models_de import top_k_model
    from merlin_models_de.persistence.table_export import read_manifest
    from merlin_models_de.serving.ensemble import column_array, load_model, load_workflow
    from merlin_models_de.serving.faiss_index import build_faiss_index
    from merlin_models_de.serving.retrieval import retrieval_ensemble, save_query_model

    sessions_dir = out / "nvt/sessions"
    workflow = load_workflow(sessions_dir / "workflow")
    scalars = [c.name for c in workflow.output_schema if not c.is_list]
    assert scalars == ["session_id", "item_id_count"]
    train_next_item.main([str(sessions_dir), "--epochs", "1", "--dim", "8"])
    model = load_model(sessions_dir / "model")
    item = train_next_item.item_column(workflow.output_schema)
    assert read_manifest(str(sessions_dir / "items"))["table"] == "item_id" != item
    rows = build_faiss_index(
        str(sessions_dir / "items"), str(tmp_path / "items.faiss"), batch_rows=37
    )
    assert rows == workflow.output_schema[item].int_domain.max + 1

    events = pd.read_parquet(out / "raw/events/valid.parquet")
    sessions = workflow.transform(Dataset(events)).to_ddf().compute()
    seq = tf.ragged.constant(sessions[item].tolist(), dtype=tf.int64)
    k = 10
    _, want = top_k_model(model, k=k)(
        {f"{item}__values": seq.flat_values, f"{item}__offsets": seq.row_splits}
    )
    for name, signature_of in (("workflow", sessions_dir / "workflow"), ("model", None)):
        save_query_model(model, str(tmp_path / name), signature_of)
        ensemble = retrieval_ensemble(
            sessions_dir / "workflow", tmp_path / name, tmp_path / "items.faiss", k=k
        )
        got = column_array(ensemble.transform(events), "candidate_ids").reshape(-1, k)
        assert got.shape == (len(sessions), k)
        assert len({tuple(r) for r in got}) > 1  # sessions get different items
        np.testing.assert_array_equal(got, want.numpy(), err_msg=f"signature of the {name}")
