"""model.compile / fit / evaluate / predict / save with Merlin's own Horovod wrapping, against
a plain single-process run (a subprocess without Horovod) on the same global batches."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.registry import is_importable
from merlin_models_de.variables import embedding_blocks
from tests.ranks import oracle_dlrm as fc
from tests.ranks.one_process import one_process_env
from tests.tf_inspection import TFLogRecords, stage_names_per_trace

PER_RANK = 32
STEPS = 4


def reference(spec, data, tmp, runner="tests.ranks.fit_reference"):
    """Rank 0 runs the single-process reference (module ``runner``: IN.npz OUT.npz); every
    rank gets its results."""
    result = None
    if comm.rank() == 0:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, spec=json.dumps(spec), **data)
        env = one_process_env()
        run = subprocess.run(
            [sys.executable, "-m", runner, src, dst],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=os.getcwd(),
        )
        if run.returncode == 0:
            result = dict(np.load(dst, allow_pickle=True))
        else:
            result = {"error": run.stderr[-3000:]}
    result = comm.broadcast_object(result, root_rank=0)
    assert "error" not in result, result.get("error")
    return result


def started_like_reference(spec, tmp_path_factory, seed, runner="tests.ranks.fit_reference"):
    """Runs the reference (module ``runner``) on fresh data; returns it, the model built here
    with the reference's initial weights, this rank's row indices and its (x, y)."""
    n, r = comm.size(), comm.rank()
    data = comm.broadcast_object(fc.make_data(n * PER_RANK * STEPS, seed=seed))
    ref = reference(spec, data, str(tmp_path_factory.mktemp("ref")), runner)
    model = fc.build_model(spec)
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), PER_RANK, n, r)
    x_mine, y_mine = {k: v[rows] for k, v in x.items()}, y[rows]
    model(fc.take(x_mine, 0, 2))
    fc.restore(model, ref, "initial")
    return ref, model, rows, x_mine, y_mine


DE = pytest.mark.skipif(
    not is_importable("distributed-embeddings"),
    reason="NVIDIA distributed-embeddings does not import here",
)


# (adam with memory_optimized left to test_checkpoint's resume oracle and the block-level
# oracles of test_oracle.py: each fit oracle here costs about a minute of CI)
# feed "tf.data": fit reads a tf.data.Dataset, whose id exchange runs one batch ahead in the
# input pipeline (backends/horovod/ahead.py); "numpy": Keras batches the arrays, the step exchanges
@pytest.mark.parametrize(
    "optimizer, strategy, column, backend, feed",
    [
        pytest.param("sgd", "basic", None, "horovod", "numpy", marks=pytest.mark.full),
        ("adagrad", "memory_balanced", 4000, "horovod", "tf.data"),
        pytest.param(
            "adagrad", "memory_optimized", 4000, "distributed-embeddings", "tf.data", marks=DE
        ),
        pytest.param("adam", "basic", None, "distributed-embeddings", "numpy", marks=DE),
    ],
)
def test_fit_evaluate_predict_match_one_process(
    hvd, tmp_path_factory, optimizer, strategy, column, backend, feed
):
    spec = dict(
        optimizer=optimizer,
        lr=0.05,
        strategy=strategy,
        column=column,
        world_size=comm.size(),
        per_rank=PER_RANK,
        backend=backend,
    )
    ref, model, rows, x_mine, y_mine = started_like_reference(spec, tmp_path_factory, seed=3)
    before = model.predict(x_mine, batch_size=PER_RANK, verbose=0)
    np.testing.assert_allclose(before, ref["predictions_before"][rows], rtol=1e-5, atol=1e-6)
    model.compile(optimizer=fc.optimizer(optimizer, spec["lr"]))  # Merlin scales lr by n
    losses = fc.LossRecorder()
    if feed == "tf.data":
        train = tf.data.Dataset.from_tensor_slices((x_mine, y_mine)).batch(PER_RANK)
        fit_args, fit_kwargs = (train,), {}
    else:
        fit_args, fit_kwargs = (x_mine, y_mine), dict(batch_size=PER_RANK, shuffle=False)
    with TFLogRecords() as log:
        model.fit(*fit_args, epochs=1, verbose=0, callbacks=[losses], **fit_kwargs)
    (block,) = embedding_blocks(model)
    # the traced step read the ids the pipeline exchanged (the horovod backend only)
    kept = getattr(block.backend, "lookahead", None)
    assert (kept is not None and kept.traced_steps == 1) == (
        feed == "tf.data" and backend == "horovod"
    )
    # every variable gets a gradient on every rank (the exchange anchor reads an exact 0)
    assert not [m for m in log.messages if "Gradients do not exist" in m], log.messages
    # the optimizer's slots existed before the step: Keras traced it once, not twice
    assert model.train_function.experimental_get_tracing_count() == 1
    if backend == "horovod":
        # the step's rounds are the schedule's: the rows forward and one all-to-all back
        # (rows and the dense average, backends/horovod/backward.py); with tf.data the next
        # batch's ids ride in the rows forward (the step's own "ids" exchange runs only when
        # nothing is kept), else the ids go before the lookups
        (rounds,) = stage_names_per_trace(model.train_function)
        scheduled = block.backend.schedule.in_fit(next_batch=feed == "tf.data", merged=True)
        assert rounds == [c.name for c in scheduled], rounds
        assert rounds == ["ids", "vectors", "mmde_merged"], rounds

    final = fc.snapshot(model)
    # Adam divides by sqrt(v): rows with tiny gradients magnify float round-off of the
    # differently ordered sums, so its tolerance is looser
    atol = 1e-4 if optimizer == "adam" else 1e-5
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=atol, err_msg=key)
    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-4, atol=1e-5)
    assert not np.allclose(final["table/C1"], ref["initial/table/C1"])  # it trained

    evaluation = model.evaluate(x_mine, y_mine, batch_size=PER_RANK, verbose=0, return_dict=True)
    want = json.loads(str(ref["evaluation"]))
    for name in ("loss", "binary_accuracy", "precision", "recall", "auc"):
        assert evaluation[name] == pytest.approx(want[name], rel=1e-4, abs=1e-5), name
    predictions = model.predict(x_mine, batch_size=PER_RANK, verbose=0)
    np.testing.assert_allclose(predictions, ref["predictions"][rows], rtol=1e-4, atol=1e-6)


@pytest.mark.full  # frozen layers: also test_model_api.py (tables frozen by name)
def test_only_tables_train_when_every_dense_layer_is_frozen(hvd, tmp_path_factory):
    """Every trainable variable is a sharded table: the optimizer has no gradient to average
    (no group at all: Horovod's own groups=1 fails on an empty list) and training still
    equals one process."""
    spec = dict(
        optimizer="adagrad",
        lr=0.05,
        strategy="memory_balanced",
        column=4000,
        world_size=comm.size(),
        per_rank=PER_RANK,
        tables_only=True,
    )
    ref, model, _, x_mine, y_mine = started_like_reference(spec, tmp_path_factory, seed=5)
    assert {v.name for v in model.trainable_variables} <= {
        v.name for b in embedding_blocks(model) for v in b.trainable_variables
    }
    model.compile(optimizer=fc.optimizer("adagrad", spec["lr"]))
    model.fit(x_mine, y_mine, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    final = fc.snapshot(model)
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
        if key.startswith("dense/"):
            np.testing.assert_array_equal(value, ref[f"initial/{key}"], err_msg=key)
    assert not np.allclose(final["table/C1"], ref["initial/table/C1"])  # the tables trained


def test_save_exports_a_single_process_model(hvd, tmp_path_factory):
    n, r = comm.size(), comm.rank()
    spec = dict(
        optimizer="adagrad",
        lr=0.05,
        strategy="memory_balanced",
        column=4000,
        world_size=n,
        per_rank=PER_RANK,
        small=True,
    )
    data = fc.only_columns(
        comm.broadcast_object(fc.make_data(n * PER_RANK * 2, seed=4)),
        fc.small_schema().column_names,
    )
    model = fc.build_model(spec)
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), PER_RANK, n, r)
    model.compile(optimizer=fc.optimizer("adagrad", 0.05))
    model.fit({k: v[rows] for k, v in x.items()}, y[rows], batch_size=PER_RANK, epochs=1, verbose=0)
    path = comm.broadcast_object(str(tmp_path_factory.mktemp("export")) if r == 0 else None)
    model.save(path)  # every rank calls it
    mine = model.predict({k: v[rows] for k, v in x.items()}, batch_size=PER_RANK, verbose=0)
    everyone = comm.allgather_object((rows, mine))
    if r == 0:
        order = np.concatenate([rw for rw, _ in everyone])
        distributed = np.concatenate([p for _, p in everyone])[np.argsort(order)]
        code = (
            "import sys, json, numpy as np, tensorflow as tf\n"
            "import merlin_models_de\n"
            "data = dict(np.load(sys.argv[2]))\n"
            "m = tf.keras.models.load_model(sys.argv[1])\n"
            "x = {k: v.reshape(-1, 1) for k, v in data.items() if k != 'label'}\n"
            "np.save(sys.argv[3], m.predict(x, batch_size=64, verbose=0))\n"
            "# the exported model loads and predicts without Horovod\n"
            "hvd = sorted(n for n in sys.modules if n.startswith('horovod'))\n"
            "assert not hvd, f'loading the exported model imported {hvd}'\n"
        )
        src = os.path.join(path, "..", "data.npz")
        np.savez(src, **data)
        out = os.path.join(path, "..", "pred.npy")
        env = one_process_env()
        run = subprocess.run(
            [sys.executable, "-c", code, path, src, out],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        problem = run.stderr[-3000:] if run.returncode else None
        if problem is None:
            try:
                np.testing.assert_allclose(np.load(out), distributed, rtol=1e-4, atol=1e-6)
            except AssertionError as err:
                problem = str(err)
    else:
        problem = None
    # rank 0 checks; every rank fails with its finding (one rank failing alone would leave
    # the other waiting in the next collective)
    problem = comm.broadcast_object(problem)
    assert problem is None, problem
