"""The step schedule (backends/horovod/schedule.py) is what a traced ``fit`` step runs: the
names and the number of the collectives in Keras' train function equal the schedule's, for
one-hot and multi-hot features and row-sliced tables, with the rows' backward merged or not.
(tests/ranks/test_fit.py checks the same with the next batch's ids sent ahead.)"""

import re

import pytest

from merlin_models_de.variables import embedding_blocks
from tests.tf_inspection import collectives

pytestmark = pytest.mark.usefixtures("hvd")


def music_model(merge_backward):
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
        categorical, dim=8, row_slice_threshold=1000, merge_backward=merge_backward
    )
    model = mm.Model(
        mm.InputBlockV2(schema, categorical=block), mm.MLPBlock([8]), mm.BinaryOutput("click")
    )
    return model, data, schema


def stage_names_per_trace(function) -> list:
    """Per trace of a ``tf.function`` (Merlin's loader may trace the step twice), its
    collectives, each by its name after the block's prefix."""
    traces = function._list_all_concrete_functions()
    return [
        sorted(
            re.sub(r"^mmde_.*_[0-9a-f]{8}_", "", name.rsplit("/", 1)[-1])
            for name in collectives(trace)
        )
        for trace in traces
    ]


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "plain"])
def test_a_fit_step_runs_the_schedules_collectives(merged):
    import merlin.models.tf as mm

    model, data, _ = music_model(merge_backward=merged)
    model.compile(optimizer="adagrad")
    model.fit(
        mm.Loader(data.repartition(npartitions=2), batch_size=16, drop_last=True),
        epochs=1,
        verbose=0,
    )
    (block,) = embedding_blocks(model)
    # list features come ragged: the next batch is not sent ahead (test_fit.py)
    scheduled = block.backend.schedule.in_fit(next_batch=False, merged=merged)
    traces = stage_names_per_trace(model.train_function)
    assert traces and all(t == sorted(c.name for c in scheduled) for t in traces), traces
    kinds = {c.name: c.op for c in scheduled}
    assert {"ids", "values", "vectors", "rw_item_id_ids", "rw_item_id_rows"} <= set(kinds)
    assert ("mmde_merged" in kinds) == merged
