"""The step pipeline (backends/horovod/pipeline.py) runs the schedule (schedule.py), in order: the
collectives of Keras' train, test and predict functions, in the order the trace makes them,
equal the schedule's, for one-hot and multi-hot features and row-sliced tables; with the
rows' backward merged or not; with the next batch's ids sent alone (a plan without pooled
rows); with Merlin's ``MultiOptimizer`` and ``steps_per_execution``. (tests/ranks/test_fit.py
checks a step whose next batch's ids ride in the rows' exchange.)"""

import numpy as np
import pytest

from merlin_models_de.variables import embedding_blocks
from tests.tf_inspection import stage_names_per_trace

pytestmark = pytest.mark.usefixtures("hvd")


def music_model(merge_backward, row_slice_threshold=1000):
    """A ranking model over Merlin's music-streaming schema: one-hot ids, two multi-hot
    features sharing one table, three tables row-sliced."""
    import merlin.models.tf as mm
    from merlin.datasets.synthetic import generate_data

    import merlin_models_de  # noqa: F401

    data = generate_data("music-streaming", 64)
    schema = data.schema.select_by_name(
        [
            "session_id",
            "item_id",
            "item_category",
            "item_genres",
            "user_genres",
            "user_id",
            "country",
            "click",
        ]
    )
    categorical = schema.excluding_by_name(["click"])
    block = mm.DistributedEmbeddings(
        categorical,
        dim=8,
        row_slice_threshold=row_slice_threshold,
        merge_backward=merge_backward,
    )
    model = mm.Model(
        mm.InputBlockV2(schema, categorical=block), mm.MLPBlock([8]), mm.BinaryOutput("click")
    )
    return model, data, schema


def feature_names(block) -> list:
    """The block's features in the order Merlin's concatenation reads them (by name)."""
    return sorted(f.name for f in block.features)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "plain"])
def test_fit_evaluate_and_predict_run_the_schedule_in_order(merged):
    import merlin.models.tf as mm

    model, data, _ = music_model(merge_backward=merged)
    model.compile(optimizer="adagrad")
    loader = mm.Loader(data.repartition(npartitions=2), batch_size=16, drop_last=True)
    model.fit(loader, epochs=1, verbose=0)
    (block,) = embedding_blocks(model)
    schedule = block.backend.schedule
    # list features come ragged: the next batch is not sent ahead (test_fit.py)
    scheduled = [
        c.name
        for c in schedule.in_fit(next_batch=False, merged=merged, read_order=feature_names(block))
    ]
    traces = stage_names_per_trace(model.train_function)
    assert traces and all(t == scheduled for t in traces), (traces, scheduled)
    assert scheduled[:3] == ["ids", "values", "vectors"]
    assert ("mmde_merged" in scheduled) == merged
    assert ("vectors_grad" in scheduled) == (not merged)

    forward = [c.name for c in schedule.forward(ahead=False)]
    model.evaluate(loader, verbose=0)
    model.predict(loader, verbose=0)
    for function in (model.test_function, model.predict_function):
        traces = stage_names_per_trace(function)
        assert traces and all(t == forward for t in traces), (traces, forward)


def test_next_ids_alone_multi_optimizer_and_steps_per_execution():
    """Every table row-sliced: no pooled rows' exchange carries the next batch's ids, so
    they go alone after the row-sliced lookups; with Merlin's ``MultiOptimizer`` and
    ``steps_per_execution`` a step runs the same collectives, in the same order."""
    import merlin.models.tf as mm
    import tensorflow as tf

    from merlin_models_de import comm

    n = comm.size()
    _, data, schema = music_model(merge_backward=True)
    frame = data.to_ddf().compute()
    names = ["item_id", "session_id", "user_id", "country"]
    block = mm.DistributedEmbeddings(schema.select_by_name(names), dim=8, row_slice_threshold=1)
    model = mm.Model(
        mm.InputBlockV2(schema.select_by_name([*names, "click"]), categorical=block),
        mm.MLPBlock([8]),
        mm.BinaryOutput("click"),
    )
    multi = mm.MultiOptimizer(
        default_optimizer="adagrad", optimizers_and_blocks=[mm.OptimizerBlocks("sgd", block)]
    )
    model.compile(optimizer=multi, steps_per_execution=2)
    mine = slice(comm.rank(), None, n)
    features = {name: frame[name].to_numpy().astype(np.int64)[mine] for name in names}
    labels = frame["click"].to_numpy().astype(np.float32)[mine]
    train = tf.data.Dataset.from_tensor_slices((features, labels)).batch(8, drop_remainder=True)
    model.fit(train, epochs=1, verbose=0)
    assert block.backend.lookahead.traced_steps >= 1  # the step sent the next batch's ids
    schedule = block.backend.schedule
    scheduled = [
        c.name
        for c in schedule.in_fit(
            next_batch=True,
            merged=True,
            read_order=feature_names(block),
            multi_optimizer=True,
        )
    ]
    forward = [f"rw_{name}_{part}" for name in block_order(block) for part in ("ids", "rows")]
    assert scheduled == [
        "ids",
        *forward,
        "ids_next",
        *[f"rw_{name}_rows_grad" for name in sorted(names)],
        "mmde_grad_multi_float32",
    ], scheduled
    traces = stage_names_per_trace(model.train_function)
    assert traces and all(t == scheduled for t in traces), (traces, scheduled)


def block_order(block) -> list:
    return [f.name for f in block.features]


def test_a_rank_that_serves_no_pooled_lookup_joins_the_multi_hot_exchange():
    """One multi-hot feature, its table whole on rank 0: the last rank serves no pooled lookup but runs the multi-hot values' exchange with empty
    lengths; fit, evaluate and predict run the schedule on both ranks."""
    import merlin.models.tf as mm

    from merlin_models_de import comm

    _, data, schema = music_model(merge_backward=True)
    names = ["item_genres"]
    # a threshold above the table: kept whole (one table on 2 ranks is otherwise split)
    block = mm.DistributedEmbeddings(
        schema.select_by_name(names), dim=8, column_slice_threshold=10**9
    )
    model = mm.Model(
        mm.InputBlockV2(schema.select_by_name([*names, "click"]), categorical=block),
        mm.MLPBlock([8]),
        mm.BinaryOutput("click"),
    )
    model.compile(optimizer="adagrad")
    loader = mm.Loader(data.repartition(npartitions=2), batch_size=16, drop_last=True)
    model.fit(loader, epochs=1, verbose=0)
    assert [s.rank for s in block.plan.shards] == [0]
    assert block.backend.routing.counts(comm.size() - 1) == (0, 0)
    forward = [c.name for c in block.backend.schedule.forward(ahead=False)]
    assert forward[:2] == ["ids", "values"]
    model.evaluate(loader, verbose=0)
    predictions = model.predict(loader, verbose=0)
    assert np.isfinite(predictions).all()
    for function in (model.test_function, model.predict_function):
        traces = stage_names_per_trace(function)
        assert traces and all(t == forward for t in traces), (traces, forward)
