"""Epochs of the commands (apps/common/epochs.py), in one process: where a checkpoint's step
resumes, a resumed epoch's rest of a tf.data pipeline or of a loader, and equal steps."""

import pytest
import tensorflow as tf

from merlin_models_de.apps.common.epochs import (
    RestOfEpoch,
    batch_count,
    epoch_batches,
    equal_steps_for,
    rest_of_epoch,
    resume_point,
)


@pytest.mark.parametrize(
    "step, expected", [(0, (0, 0)), (24, (1, 8)), (32, (2, 0)), (48, (3, 0)), (99, (3, 0))]
)
def test_resume_point_of_a_step(step, expected):
    assert resume_point(step, steps=16, epochs=3) == expected


def test_the_rest_of_an_epoch_of_a_pipeline():
    data = tf.data.Dataset.range(10)
    assert batch_count(data) == 10 and equal_steps_for(data, "train") == 10
    assert list(rest_of_epoch(data, 3, 6).as_numpy_iterator()) == [3, 4, 5]
    repeated = epoch_batches(data, 4).take(6)
    assert list(repeated.as_numpy_iterator()) == [0, 1, 2, 3, 0, 1]


class _Loader:
    """Merlin's loader's protocol: reading its length starts it over; next gives a batch."""

    def __init__(self, n):
        self.n, self.at, self.ends = n, 0, 0

    def __len__(self):
        self.at = 0
        return self.n

    def __next__(self):
        self.at += 1
        return self.at - 1

    def on_epoch_end(self):
        self.ends += 1


def test_the_rest_of_an_epoch_of_a_loader_skips_after_each_start():
    loader = _Loader(8)
    rest = RestOfEpoch(loader, skip=5, steps=8)
    assert len(rest) == 3 and [rest[i] for i in range(3)] == [5, 6, 7]
    rest.on_epoch_end()
    assert loader.ends == 1 and [rest[i] for i in range(3)] == [5, 6, 7]
    with pytest.raises(ValueError, match=r"no full eval batch. Batches per rank: \[0\]"):
        equal_steps_for(tf.data.Dataset.range(0), "eval")
