"""Retrieval models saved and loaded in one process: ``merlin_models_de.load_model`` gives the
Merlin model back (every Keras class of the package registered, also in a fresh process
that never imported the sampler), its retrieval encoders ready for Merlin's
``to_top_k_encoder``, and ``save_query_model`` refuses the models whose query side it cannot
serve, naming what it received."""

import ast
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import merlin_models_de
from merlin_models_de.merlin.register import KERAS_MODULES
from merlin_models_de.serving.retrieval import QueryTower
from tests.ranks import tied_reference as tr

ROOT = pathlib.Path(merlin_models_de.__file__).parent
REPO = ROOT.parent


def _registering_modules():
    """Modules of the package that register a class with Keras (by reading the source)."""
    found = set()
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "register_keras_serializable":
                module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
                found.add(module)
    return found


def test_load_model_registers_every_keras_class_of_the_package():
    assert _registering_modules() == set(KERAS_MODULES)


@pytest.fixture(scope="module")
def contrastive_dir(tmp_path_factory):
    """A next-item model trained with the documented global in-batch negatives
    (``ContrastiveOutput(to_call=block["item"], negative_samplers=GlobalInBatchSampler())``),
    saved; and a few queries."""
    model, _ = tr.build_model({"output": "contrastive"})
    x, y = tr.split_xy(tr.make_data(64, seed=3))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = tmp_path_factory.mktemp("contrastive") / "model"
    model.save(str(path))
    queries = {k: tf.constant(v[:5, 0]) for k, v in x.items()}
    want = QueryTower(model).call(queries)["query"].numpy()  # the trained model's query side
    return path, queries, want


def test_a_model_with_the_global_sampler_loads_in_a_fresh_process_and_serves_its_queries(
    contrastive_dir, tmp_path
):
    path, queries, want = contrastive_dir
    query_dir = tmp_path / "query"
    # a fresh process: only load_model can have registered the sampler
    code = (
        "import sys, tensorflow as tf, merlin_models_de as m\n"
        # Keras alone revives a bare copy (the sampler's class is unknown): refused, named
        "bare = tf.keras.models.load_model(sys.argv[1], compile=False)\n"
        "try:\n    m.save_query_model(bare, sys.argv[2])\n"
        "except ValueError as e:\n    print('refused:', e)\n"
        "model = m.load_model(sys.argv[1])\n"
        "m.save_query_model(model, sys.argv[2])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run(
        [sys.executable, "-c", code, str(path), str(query_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    refused = [l for l in run.stdout.splitlines() if l.startswith("refused:")]
    assert len(refused) == 1 and "merlin_models_de.load_model" in refused[0], run.stdout
    served = tf.saved_model.load(str(query_dir)).signatures["serving_default"]
    got = served(**queries)["query"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


USERS, ITEMS, CATEGORIES = 20, 30, 5


def _two_tower_data():
    import pandas as pd
    from merlin.io import Dataset
    from merlin.schema import Schema, Tags

    from tests.schemas import cat

    schema = Schema(
        [
            cat("user_id", USERS - 1, tags=(Tags.USER_ID, Tags.USER)),
            cat("item_id", ITEMS - 1, tags=(Tags.ITEM_ID, Tags.ITEM)),
            cat("item_category", CATEGORIES - 1, tags=(Tags.ITEM,)),
        ]
    )
    rng = np.random.default_rng(0)
    items = rng.integers(0, ITEMS, 256)
    train = pd.DataFrame(
        {
            "user_id": rng.integers(0, USERS, 256),
            "item_id": items,
            "item_category": items % CATEGORIES,
        }
    )
    item_schema = schema.select_by_tag(Tags.ITEM)
    candidates = pd.DataFrame(
        {"item_id": np.arange(ITEMS), "item_category": np.arange(ITEMS) % CATEGORIES}
    )
    return (
        schema,
        Dataset(train, schema=schema),
        Dataset(candidates, schema=item_schema),
    )


def _tower(schema):
    import merlin.models.tf as mm

    return mm.Encoder(
        mm.InputBlockV2(schema, categorical=mm.DistributedEmbeddings(schema, dim=8)),
        mm.MLPBlock([8]),
    )


def _top_k_ids(model, candidates, queries):
    encoder = model.to_top_k_encoder(candidates, k=5, batch_size=16)
    return encoder(queries).identifiers.numpy()


@pytest.mark.full  # ~80 s; the CI tier serves retrieval by the ensemble test (next-item model)
def test_a_loaded_two_tower_model_gives_the_trained_models_top_k_and_no_query_model(tmp_path):
    import merlin.models.tf as mm
    from merlin.schema import Tags

    schema, train, candidates = _two_tower_data()
    tf.keras.utils.set_random_seed(2)
    model = mm.TwoTowerModelV2(
        _tower(schema.select_by_tag(Tags.USER)), _tower(schema.select_by_tag(Tags.ITEM))
    )
    model.compile(optimizer="adam")
    model.fit(mm.Loader(train, batch_size=64), epochs=1, verbose=0)
    model.save(str(tmp_path / "model"))
    queries = {"user_id": tf.constant(np.arange(USERS), tf.int64)}
    items = {  # the candidates, in id order
        "item_id": tf.constant(np.arange(ITEMS), tf.int64),
        "item_category": tf.constant(np.arange(ITEMS) % CATEGORIES, tf.int64),
    }
    scores = tf.matmul(
        model.query_encoder(queries), model.candidate_encoder(items), transpose_b=True
    )
    want = tf.math.top_k(scores, k=5).indices.numpy()

    loaded = merlin_models_de.load_model(str(tmp_path / "model"))
    np.testing.assert_array_equal(_top_k_ids(loaded, candidates, queries), want)
    # its items are the candidate tower's outputs, not a table the Faiss index could hold
    with pytest.raises(ValueError, match="candidate tower") as err:
        merlin_models_de.save_query_model(loaded, str(tmp_path / "query"))
    assert "query_encoder" in str(err.value) and "RetrievalModelV2" in str(err.value)
