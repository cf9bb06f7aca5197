"""The edges of serving a fitted NVTabular workflow (docs/serving.md, docs/nvtabular.md):
NVTabular's row-dependent hashing refused and a value-only hashing in its place, a null list,
a row whose key a JoinExternal side table lacks, a list column fitted with an empty first row,
a value that overflows the model's float32. One small workflow and a DLRM trained in this
process on 64 rows."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("nvtabular")
pytest.importorskip("merlin.systems")

import merlin.models.tf as mm  # noqa: E402
import nvtabular as nvt  # noqa: E402
from merlin.io import Dataset  # noqa: E402
from merlin.schema import Tags  # noqa: E402
from nvtabular import ops  # noqa: E402

from merlin_models_de.serving.hashing import ValueCategorify, ValueHashBucket  # noqa: E402

ROWS = 64
SIDE = pd.DataFrame({"item_id": [f"i-{i}" for i in range(6)], "brand": list("abcabc")})


def raw_rows(rows=ROWS, seed=0):
    """String ids, a long-tailed category, a list column whose first row is empty (so the
    fitted input dtype of ``tags`` is unknown), a small-valued price."""
    rng = np.random.default_rng(seed)
    tags = [list(rng.choice(["t1", "t2", "t3"], size=rng.integers(0, 3))) for _ in range(rows)]
    tags[0] = []
    return pd.DataFrame(
        {
            "user_id": [f"u-{i}" for i in rng.integers(0, 12, rows)],
            "item_id": [f"i-{i}" for i in rng.integers(0, 6, rows)],
            "category": [f"c-{i}" for i in rng.zipf(1.5, rows) % 40],
            "tags": tags,
            "price": rng.uniform(0.1, 0.3, rows),
            "click": rng.integers(0, 2, rows).astype(np.int64),
        }
    )


def workflow(categories):
    user = ["user_id"] >> ValueHashBucket(50)
    item = ["item_id"] >> ops.JoinExternal(SIDE, on="item_id", columns_ext=["item_id", "brand"])
    item = item >> ops.Categorify(out_path=categories)
    category = ["category"] >> ValueCategorify(out_path=categories, max_size=10, num_buckets=4)
    tags = ["tags"] >> ops.Categorify(out_path=categories)
    price = ["price"] >> ops.FillMissing() >> ops.Normalize()
    label = ["click"] >> ops.AddMetadata(tags=[Tags.BINARY_CLASSIFICATION, Tags.TARGET])
    return nvt.Workflow(user + item + category + tags + price + label)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the directory of the workflow and the model, the trained model, its ranking
    ensemble)."""
    from merlin_models_de import DistributedEmbeddings
    from merlin_models_de.serving.ensemble import ranking_ensemble

    root = tmp_path_factory.mktemp("edges")
    wf = workflow(str(root / "categories"))
    train = wf.fit_transform(Dataset(raw_rows()))
    wf.save(str(root / "workflow"))
    schema = train.schema
    model = mm.DLRMModel(
        schema,
        embeddings=DistributedEmbeddings(schema.select_by_tag(Tags.CATEGORICAL), dim=4),
        bottom_block=mm.MLPBlock([4]),
        top_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryClassificationTask("click"),
    )
    model.compile(optimizer="adam")
    model.fit(mm.Loader(train, batch_size=16), epochs=1, verbose=0)
    model.save(str(root / "model"))
    ensemble = ranking_ensemble(root / "workflow", root / "model", label_columns=["click"])
    return root, model, ensemble  # the trained model: model.predict as training left it


def scores(ensemble, rows):
    from merlin_models_de.serving.ensemble import column_array

    (name,) = ensemble.output_schema.column_names
    return column_array(ensemble.transform(rows.reset_index(drop=True)), name).reshape(-1)


def predicted(model, root, rows):
    """``model.predict`` on raw ``rows`` through the workflow (Merlin's loader)."""
    from merlin_models_de.serving.ensemble import serving_workflow

    features = serving_workflow(root / "workflow", ["click"]).transform(
        Dataset(rows.reset_index(drop=True))
    )
    want = model.predict(mm.Loader(features, batch_size=256, shuffle=False), verbose=0)
    if isinstance(want, dict):
        (want,) = want.values()
    return np.asarray(want).reshape(-1)


def requests(rows=8):
    return raw_rows(rows, seed=1).drop(columns=["click"])


def test_nvtabular_hashes_with_the_row_index_and_the_ensemble_refuses_it(tmp_path):
    """The claim (issue 53): NVTabular 23.08's HashBucket on pandas gives 'u-1' a different
    bucket in each row; Categorify(num_buckets) does the same to out-of-vocabulary values.
    The ensemble refuses both, naming the column and what to fit with instead."""
    from merlin_models_de.serving.ensemble import serving_workflow
    from merlin_models_de.serving.served_workflow import RowHashingError

    rows = raw_rows()
    hashed = nvt.Workflow(["user_id"] >> ops.HashBucket(1000))
    hashed.fit(Dataset(rows))
    ids = hashed.transform(Dataset(pd.DataFrame({"user_id": ["u-1"] * 3}))).compute()
    assert len(set(ids["user_id"])) > 1  # one value, several buckets
    with pytest.raises(RowHashingError, match=r"'user_id' \(HashBucket\(1000\)\).*ValueHashBucket"):
        serving_workflow(hashed)

    oov = ["category"] >> ops.Categorify(out_path=str(tmp_path), max_size=10, num_buckets=4)
    bucketed = nvt.Workflow(oov + ["user_id"])
    bucketed.fit(Dataset(rows))
    with pytest.raises(
        RowHashingError, match=r"'category' \(Categorify\(num_buckets=4\)\).*ValueCategorify"
    ):
        serving_workflow(bucketed)


def test_value_hashing_gives_a_value_one_id_in_any_row_batch_and_saved_copy(served):
    """ValueHashBucket and ValueCategorify's OOV buckets: one id per value wherever it
    stands, in the workflow written to disk too (pickled by value), inside the domain."""
    root, _, _ = served
    loaded = nvt.Workflow.load(str(root / "workflow")).remove_inputs(["click"])
    rows = requests(6).assign(user_id=["u-1", "u-7", "u-1", "u-1", "u-99", "u-99"])
    rows = rows.assign(category=["c-zz", "c-zz", "c-yy", "c-zz", "c-yy", "c-yy"])
    out = loaded.transform(Dataset(rows)).compute()
    alone = loaded.transform(Dataset(rows.iloc[[3]].reset_index(drop=True))).compute()
    users, categories = out["user_id"].to_numpy(), out["category"].to_numpy()
    assert users[0] == users[2] == users[3] == alone["user_id"][0] and users[4] == users[5]
    assert len(set(users)) == 3 and 2 <= users.min() and users.max() <= 51
    assert categories[0] == categories[1] == categories[3] == alone["category"][0]
    assert categories[2] == categories[4] == categories[5] and 2 <= categories.min() < 6
    assert loaded.output_schema["user_id"].int_domain.max == 51
    # its operators are copies of ours (pickled by value), still known to hash the value only
    from merlin_models_de.serving.served_workflow import row_hashing

    assert row_hashing(loaded) == []


def test_a_row_scores_the_same_alone_twice_and_in_a_batch(served):
    _, _, ensemble = served
    rows = requests(8)
    row = rows.iloc[[0]]
    alone = scores(ensemble, row)
    twice = scores(ensemble, pd.concat([row, row]))
    batch = scores(ensemble, pd.concat([rows.iloc[1:4], row, rows.iloc[4:]]))
    np.testing.assert_allclose(twice, np.repeat(alone, 2), rtol=1e-6)
    np.testing.assert_allclose(batch[3], alone[0], rtol=1e-6)


def test_a_null_list_is_served_as_an_empty_list(served):
    _, _, ensemble = served
    rows = requests(4)
    with_null = rows.assign(tags=[["t1"], None, ["t2", "t3"], None])
    with_empty = rows.assign(tags=[["t1"], [], ["t2", "t3"], []])
    np.testing.assert_allclose(scores(ensemble, with_null), scores(ensemble, with_empty), rtol=1e-6)
    np.testing.assert_allclose(
        scores(ensemble, with_null.iloc[[1]]), scores(ensemble, with_empty.iloc[[1]]), rtol=1e-6
    )


def test_a_new_item_missing_from_the_side_table_is_served_alone_as_model_predict(served):
    """JoinExternal leaves brand null for an item the side table lacks; a one-row request
    for it is the brand column null in every row: served, as model.predict scores the row
    in a batch with known items."""
    root, model, ensemble = served
    rows = requests(6).assign(item_id=["i-new", "i-1", "i-2", "i-3", "i-4", "i-5"])
    got = scores(ensemble, rows.iloc[[0]])
    want = predicted(model, root, rows)
    np.testing.assert_allclose(got, want[:1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(scores(ensemble, rows), want, rtol=1e-6, atol=1e-7)


def _unknown_tags_ensemble(served):
    """The ranking ensemble of a workflow whose ``tags`` input dtype was fitted as unknown
    (its first training row was empty)."""
    from merlin_models_de.serving.ensemble import ranking_ensemble

    root, _, _ = served
    fitted = nvt.Workflow.load(str(root / "workflow"))
    assert fitted.input_schema["tags"].dtype.element_type.value == "unknown"
    return ranking_ensemble(root / "workflow", root / "model", label_columns=["click"])


def test_a_list_column_fitted_as_unknown_gets_the_vocabularys_dtype(served):
    """The Triton configuration cannot hold an unknown dtype; the ensemble gives the column
    the vocabulary's dtype, which the export writes (next test)."""
    ensemble = _unknown_tags_ensemble(served)
    assert ensemble.input_schema["tags"].dtype.element_type.value == "object"


@pytest.mark.full  # 31 s (the export); the dtype it writes is checked in CI (above)
def test_the_triton_repository_is_written_for_a_list_column_fitted_as_unknown(served, tmp_path):
    _unknown_tags_ensemble(served).export(str(tmp_path / "triton"))
    config = (tmp_path / "triton/0_transformworkflowtriton/config.pbtxt").read_text()
    assert 'name: "tags__values"' in config and "TYPE_STRING" in config
    # Triton's Python runs the workflow without this package: ValueCategorify and
    # ValueHashBucket came by value, null-safe (a new item alone) and value-hashed
    run = subprocess.run(
        [sys.executable, "-c", WORKFLOW_WITHOUT_THIS_PACKAGE, str(tmp_path / "triton")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-3:] == ["by-value", "1", "same"], run.stdout


WORKFLOW_WITHOUT_THIS_PACKAGE = """
import sys
sys.modules["merlin_models_de"] = None  # any import of the package raises ImportError
import nvtabular as nvt, pandas as pd
from merlin.io import Dataset  # noqa: E402

workflow = nvt.Workflow.load(sys.argv[1] + "/0_transformworkflowtriton/1/workflow")
names = sorted(type(n.op).__name__ for n in workflow.output_node.parents_with_dependencies)
request = pd.DataFrame({"user_id": ["u-1", "u-1"], "item_id": ["i-new", "i-new"],
                        "category": ["c-x", "c-x"], "tags": [["t1"], []], "price": [0.2, 0.2]})
alone = workflow.transform(Dataset(request.iloc[:1])).compute()
both = workflow.transform(Dataset(request)).compute()
print("by-value" if {"ValueCategorify", "ValueHashBucket"} <= set(names) else names,
      alone["brand"][0],
      "same" if both["user_id"].nunique() == 1 and both["user_id"][0] == alone["user_id"][0]
      else "differs")
"""


def test_a_value_beyond_the_models_float32_is_refused_naming_the_column(served):
    from merlin_models_de.serving.request import RequestError

    _, _, ensemble = served
    rows = requests(3).assign(price=[0.2, 1e38, 0.1])
    with pytest.raises(RequestError, match=r"row 1: the workflow's output column 'price' is"):
        scores(ensemble, rows)


def test_fitting_on_a_null_first_list_fails_and_empty_lists_for_nulls_fixes_it(tmp_path):
    from merlin_models_de.serving.request import empty_lists_for_nulls

    rows = raw_rows(16).assign(tags=[None] + [["t1"]] * 15)
    with pytest.raises(TypeError, match="unhashable"):
        nvt.Workflow(["tags"] >> ops.Categorify(out_path=str(tmp_path))).fit(Dataset(rows))
    fixed = empty_lists_for_nulls(rows, ["tags"])
    assert fixed["tags"][0] == [] and fixed["tags"][1] == ["t1"]
    wf = nvt.Workflow(["tags"] >> ops.Categorify(out_path=str(tmp_path)))
    out = wf.fit_transform(Dataset(fixed)).compute()
    assert list(out["tags"][0]) == [] and list(out["tags"][1]) == [3]


def test_serving_refuses_an_nvtabular_whose_categorify_it_was_not_written_for():
    from merlin_models_de.compat import UnsupportedVersionError
    from merlin_models_de.compat.nvtabular import check_nvtabular

    check_nvtabular("23.8.0")
    with pytest.raises(UnsupportedVersionError, match=r"nvtabular 23.12.0 \(supported: 23.8"):
        check_nvtabular("23.12.0")
