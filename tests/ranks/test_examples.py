"""The hand-written next-item model of examples/train_next_item.py, on NVTabular's output of
raw session events (examples/raw_data.py + preprocess.py), trained on 2 ranks with the item
table row-sliced, equals one process on the global batches: per-step losses, the item
table and the MLP weights (the oracle of docs/design.md). Run as a module, this file is the
single-process reference: ``python -m tests.ranks.test_examples IN.npz OUT.npz``."""

import json
import os
import sys

import numpy as np
import pytest

PER_RANK, STEPS = 8, 4


def train_next_item():
    from examples import train_next_item as module  # imports Merlin: load on first use

    return module


def raw_data():
    from examples import raw_data as module

    return module


def preprocess():
    from examples import preprocess as module  # needs nvtabular

    return module


def schema_of(spec):
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    return TensorflowMetadata.from_json(spec["schema"]).to_merlin_schema()


def sessions_dataset(data, batch, item):
    """Batches of ``item``'s lists as the loader feeds them (``__values`` / ``__offsets``)."""
    import tensorflow as tf

    seq = tf.RaggedTensor.from_row_lengths(data["values"], data["lengths"])
    return (
        tf.data.Dataset.from_tensor_slices(seq)
        .batch(batch)
        .map(lambda s: {f"{item}__values": s.flat_values, f"{item}__offsets": s.row_splits})
    )


def item_of(spec):
    return train_next_item().item_column(schema_of(spec))


def build(spec):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(1)
    return train_next_item().build_model(schema_of(spec), dim=8, row_slice_threshold=spec["row"])


def reference_run(src, dst):
    """One process, global batch N*B, learning rate N*lr (Merlin scales it on N ranks)."""
    from tests.ranks import oracle_dlrm as fc

    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    model, _ = build(spec)
    model(next(iter(sessions_dataset(data, 2, item_of(spec)))))
    initial = fc.snapshot(model)
    model.compile(optimizer=fc.optimizer("adagrad", spec["lr"] * spec["world_size"]))
    losses = fc.LossRecorder()
    pre = train_next_item().predict_last(schema_of(spec))
    model.fit(
        sessions_dataset(data, spec["per_rank"] * spec["world_size"], item_of(spec)),
        epochs=1,
        verbose=0,
        callbacks=[losses],
        pre=pre,
    )
    out = {f"initial/{k}": v for k, v in initial.items()}
    out.update({f"final/{k}": v for k, v in model_snapshot(model).items()})
    np.savez(dst, losses=np.array(losses.losses), **out)


def model_snapshot(model):
    from tests.ranks import oracle_dlrm as fc

    return fc.snapshot(model)


def nvtabular_sessions(directory):
    """Raw events -> NVTabular; (schema JSON of the item-id list column, its lists as
    values + lengths)."""
    from merlin.io import Dataset

    raw_data().write(os.path.join(directory, "raw"), rows=200, sessions=200, seed=7)
    preprocess().main([os.path.join(directory, "raw"), os.path.join(directory, "nvt")])
    train = Dataset(os.path.join(directory, "nvt/sessions/train"), engine="parquet")
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    item = train_next_item().item_column(train.schema)
    lists = train.to_ddf().compute()[item].tolist()
    schema = train.schema.select_by_name([item])
    return TensorflowMetadata.from_merlin_schema(schema).to_json(), {
        "values": np.concatenate(lists).astype(np.int64),
        "lengths": np.array([len(x) for x in lists], np.int64),
    }


def test_example_next_item_model_on_nvtabular_sessions_matches_one_process(hvd, tmp_path_factory):
    pytest.importorskip("nvtabular")
    from merlin_models_de import comm
    from merlin_models_de.planner import ShardingType
    from tests.ranks import oracle_dlrm as fc
    from tests.ranks.test_fit import reference

    n, r = comm.size(), comm.rank()
    made = nvtabular_sessions(str(tmp_path_factory.mktemp("nvt"))) if r == 0 else None
    schema_json, sessions = comm.broadcast_object(made)
    total = n * PER_RANK * STEPS
    data = {
        "values": sessions["values"][: sessions["lengths"][:total].sum()],
        "lengths": sessions["lengths"][:total],
    }
    spec = dict(schema=schema_json, lr=0.05, row=64, world_size=n, per_rank=PER_RANK)
    ref = reference(
        spec, data, str(tmp_path_factory.mktemp("ref")), runner="tests.ranks.test_examples"
    )

    model, block = build(spec)
    assert block.plan.kind_of("item_id") is ShardingType.ROW_WISE
    rows = fc.rank_rows(total, PER_RANK, n, r)
    starts = np.concatenate([[0], np.cumsum(data["lengths"])])
    mine = {
        "lengths": data["lengths"][rows],
        "values": np.concatenate([data["values"][starts[i] : starts[i + 1]] for i in rows]),
    }
    model(next(iter(sessions_dataset(mine, 2, item_of(spec)))))
    fc.restore(model, ref, "initial")
    model.compile(optimizer=fc.optimizer("adagrad", spec["lr"]))
    losses = fc.LossRecorder()
    pre = train_next_item().predict_last(schema_of(spec))
    model.fit(
        sessions_dataset(mine, PER_RANK, item_of(spec)),
        epochs=1,
        verbose=0,
        callbacks=[losses],
        pre=pre,
    )

    final = model_snapshot(model)
    assert len(final) == len([k for k in ref if k.startswith("final/")])
    for key, value in final.items():
        np.testing.assert_allclose(value, ref[f"final/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    assert not np.allclose(final["table/item_id"], ref["initial/table/item_id"])
    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    assert len(per_step) == STEPS
    np.testing.assert_allclose(per_step, ref["losses"], rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    reference_run(sys.argv[1], sys.argv[2])
