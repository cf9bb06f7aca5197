"""The training step's hooks (backends/step.py): what waits is completed through the backend
class that left it, once, and one step never mixes two backends' waiting backward."""

import pytest
import tensorflow as tf

from merlin_models_de.backends.base import EmbeddingBackend
from merlin_models_de.backends.distributed_embeddings import DistributedEmbeddingsBackend
from merlin_models_de.backends.horovod.backend import HorovodBackend
from merlin_models_de.backends.step import complete_waiting, current_step, training_step


def test_what_waits_is_completed_through_its_backend_once():
    grad = tf.ones([2])
    with training_step({"a": tf.constant([1])}):
        waiting = current_step().waiting
        waiting.add(EmbeddingBackend, "an exchange")
        assert waiting.backend is EmbeddingBackend and waiting.entries == ["an exchange"]
        grads, averaged = complete_waiting([grad], [tf.Variable([0.0, 0.0])], [False])
        assert grads == [grad] and averaged == [False]
        assert not waiting and waiting.backend is None  # taken: the step ends without error
    # outside a training step nothing waits
    assert complete_waiting([grad], [None], [True]) == ([grad], [False])


def test_two_backends_waiting_in_one_step_are_refused_naming_both():
    with training_step({}):
        waiting = current_step().waiting
        waiting.add(HorovodBackend, "rows")
        with pytest.raises(
            NotImplementedError, match="backend='horovod' and backend='distributed-embeddings'"
        ):
            waiting.add(DistributedEmbeddingsBackend, "rows")
        waiting.take()
