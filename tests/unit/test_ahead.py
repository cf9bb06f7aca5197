"""The next batch in each training step, one process: the input's pairing
(backends/horovod/ahead.py), which traced calls take the next batch and what the step sees of
the batch (backends/step.py). (On 2 ranks: horovod/test_fit.py trains with the next batch's
ids exchanged ahead against one process, and horovod/test_errors.py fails every rank on a bad
id found ahead.)"""

import types

import pytest
import tensorflow as tf

from merlin_models_de.backends.horovod import ahead
from merlin_models_de.backends.horovod.backend import HorovodBackend
from merlin_models_de.backends.step import NEXT_KEY, current_step, training_step

FEATURES = (types.SimpleNamespace(name="a"), types.SimpleNamespace(name="b"))


class Block(types.SimpleNamespace):
    """Stands for a block: its features and backend are all ``ahead`` reads."""

    _mmde_embedding_block = True


def model_of(block):
    return types.SimpleNamespace(
        _flatten_layers=tf.autograph.experimental.do_not_convert(lambda **_: [block])
    )


def traced_take(transform):
    """Traces a step: opens it on a batch with the next batch's ids, asks for them twice for
    one block on ``transform(batch)``; returns what the two calls got (None: exchange in the
    step) and how many blocks took them."""
    got = []

    @tf.function
    def step(a, b):
        batch = {"a": a, "b": b, f"{NEXT_KEY}/a": a + 10, f"{NEXT_KEY}/b": b + 10}
        with training_step((batch, tf.constant(0))) as data:
            features, _ = data
            assert sorted(features) == ["a", "b"]  # the pipeline's keys never reach the model
            inputs = transform(features)
            opened = current_step()
            first = opened.next_batch_for("block", ["a", "b"], inputs)
            got.append(None if first is None else sorted(first))
            got.append(opened.next_batch_for("block", ["a", "b"], inputs))
            got.append(len(opened.claimed))
        assert current_step() is None  # gone after the step
        return tf.constant(0)

    step(tf.constant([1, 2], tf.int64), tf.constant([[3], [4]], tf.int64))
    return got[:2], got[2]


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: f,
        lambda f: {k: tf.identity(v) for k, v in f.items()},
        lambda f: {"a": tf.expand_dims(f["a"], -1), "b": tf.squeeze(f["b"], -1)},
    ],
    ids=["same", "identity", "expand-squeeze"],
)
def test_the_batch_features_read_the_exchanged_ids_once(transform):
    (first, second), uses = traced_take(transform)
    assert first == ["a", "b"]  # the next batch's features
    assert second is None  # a second call of the block in the step exchanges its own ids
    assert uses == 1


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: {"a": f["a"] + 0, "b": f["b"]},  # values derived: the ids may differ
        lambda f: {"a": f["a"], "b": tf.reshape(f["b"], [1, 2])},  # another shape per sample
        lambda f: {"a": f["a"]},  # a feature missing
        lambda f: {"a": tf.constant([1, 2], tf.int64), "b": f["b"]},  # another tensor
    ],
    ids=["derived", "reshaped", "missing", "other"],
)
def test_other_inputs_exchange_in_the_step(transform):
    (first, second), uses = traced_take(transform)
    assert first is None and second is None and uses == 0


@pytest.mark.parametrize("fixed", [False, True], ids=["batch", "drop-remainder"])
def test_each_element_gets_the_next_batch_and_the_last_an_empty_one(fixed):
    block = Block(
        features=FEATURES,
        exchange_ahead=True,
        backend=types.SimpleNamespace(supports_ahead=True, world_size=2),
    )
    model = model_of(block)
    x = {
        "a": tf.range(6, dtype=tf.int64),
        "b": tf.range(6, dtype=tf.int64)[:, None] * 10,
        "dense": tf.ones([6, 2]),
    }
    data = tf.data.Dataset.from_tensor_slices((x, tf.range(6))).batch(2, drop_remainder=fixed)
    paired = ahead.pipelined(model, data)
    assert int(paired.cardinality()) == 3  # fit still knows the steps
    got = list(paired.as_numpy_iterator())
    assert [list(f["a"]) for f, _ in got] == [[0, 1], [2, 3], [4, 5]]
    # after the last batch nothing follows, also where every batch has a fixed size: a
    # batch of zeros there would be kept and read by the next epoch's first step
    assert [list(f[f"{NEXT_KEY}/a"]) for f, _ in got] == [[2, 3], [4, 5], []]
    assert [f[f"{NEXT_KEY}/b"].shape for f, _ in got] == [(2, 1), (2, 1), (0, 1)]
    # the batch keeps the input's shapes (a fixed batch size stays known when traced)
    features, label = paired.element_spec
    assert features["a"].shape == data.element_spec[0]["a"].shape
    assert features["dense"].shape == data.element_spec[0]["dense"].shape
    assert label.shape == data.element_spec[1].shape
    assert [list(y) for _, y in got] == [[0, 1], [2, 3], [4, 5]]
    assert f"{NEXT_KEY}/dense" not in got[0][0]  # only the blocks' id features
    # a feature a block reads as something other than dense ids: no pairing
    ragged = tf.data.Dataset.from_tensor_slices(
        ({"a": tf.ragged.constant([[1], [2, 3]]), "b": [1, 2]}, [0, 1])
    ).batch(2)
    assert ahead.pipelined(model, ragged) is ragged


def test_one_process_has_no_pipeline_stage():
    import merlin.models.tf as mm

    from tests.ranks import oracle_dlrm as fc

    block = mm.DistributedEmbeddings(fc.small_schema(), dim=4)
    data = tf.data.Dataset.from_tensor_slices({"C1": tf.constant([1, 2], tf.int64)}).batch(2)
    assert ahead.pipelined(block, data) is data  # world size 1: no exchange to move
    assert ahead.pipelined(block, [1, 2]) == [1, 2]  # not a tf.data input


def test_the_option_is_checked_and_saved():
    import merlin.models.tf as mm

    from tests.ranks import oracle_dlrm as fc

    with pytest.raises(
        ValueError,
        match=r"exchange_ahead must be True or False\. Received: exchange_ahead='no'",
    ):
        mm.DistributedEmbeddings(fc.small_schema(), dim=4, exchange_ahead="no")
    block = mm.DistributedEmbeddings(fc.small_schema(), dim=4, exchange_ahead=False)
    assert block.get_config()["exchange"]["exchange_ahead"] is False
    assert type(block).from_config(block.get_config()).exchange_ahead is False


def test_a_problem_kept_for_the_next_step_reads_as_its_check():
    """A bad id found one step ahead is asserted by the next step from a kept line, which
    says what the step's own check would have said."""
    from merlin_models_de.backends.horovod.ahead import first_problem

    deferred = [
        (tf.constant(True), ["never shown"]),
        (
            tf.constant(False),
            [
                "An id is outside its table. Received: feature=",
                tf.constant("C1"),
                "id=",
                tf.constant(10**6, tf.int64),
            ],
        ),
        (tf.constant(False), ["sizes:", tf.constant([8, 6], tf.int64)]),
    ]
    ok, line = first_problem(deferred)
    assert not ok.numpy()
    assert line.numpy().decode() == (
        "An id is outside its table. Received: feature= C1 id= 1000000"
    )
    ok, line = first_problem(deferred[:1] + deferred[2:])
    assert line.numpy().decode() == "sizes: [8 6]"
    ok, line = first_problem(deferred[:1])
    assert ok.numpy()


def test_a_step_whose_waiting_backward_was_not_completed_fails_naming_why():
    """A gradient computed outside the compiled optimizer would leave the tables' gradients
    waiting: the step fails at trace time instead of training without them."""
    with pytest.raises(RuntimeError, match="was not completed.*merge_backward=False"):
        with training_step({"a": tf.constant([1])}):
            current_step().waiting.add(HorovodBackend, "an exchange")
    assert current_step() is None
