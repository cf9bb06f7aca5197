"""One training step's values, handed from the step's owner to the blocks and the optimizer.

Merlin's ``train_step`` calls the model, whose blocks call the embedding block, then
``optimizer.minimize``; none of those calls can carry an argument of ours. The step's owner
(the train-step hook, :func:`training_step`) therefore opens one :class:`TrainingStep` for the
duration of the traced step, and the two places that need it read it once, where the call
chain starts being ours:

- the block's ``call`` takes the next batch's ids for its features
  (:meth:`TrainingStep.next_batch_for`) and the list its exchanges' backward waits in
  (``waiting``), and passes both to its backend as arguments;
- the optimizer's gradient hook completes what waits (``backends/horovod/backward.py``).

Everything further down receives these values as arguments. A step whose waiting backward was
not completed (a gradient computed outside the optimizer) fails at trace time, naming why,
instead of training without the tables' gradients.

Example:
    >>> with training_step((features, labels)) as data:  # doctest: +SKIP
    ...     train_step(data)
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

NEXT_KEY = "__mmde_next"  # reserved feature keys of the input pipeline: f"{NEXT_KEY}/{feature}"
# ops whose output holds exactly their input's values, in order
SAME_VALUES = {"Identity", "ExpandDims", "Squeeze", "Reshape"}

_current: contextvars.ContextVar = contextvars.ContextVar("mmde_training_step", default=None)


@dataclass
class TrainingStep:
    """The values of one traced training step (see the module docstring)."""

    batch: dict  # the step's features, as the model receives them
    following: dict  # the next batch's id features, by feature name ({}: the input has none)
    waiting: list = field(default_factory=list)  # exchanges whose backward waits
    claimed: set = field(default_factory=set)  # blocks that took the next batch

    def next_batch_for(self, block_key, feature_names, inputs):
        """The next batch's features for a call of a block on ``inputs``, or None.

        Only for a call on the step's batch (each input *is* the batch's feature, through ops
        that keep values: identity, reshape, expand / squeeze dims), once per block and step:
        a model that derives ids before the block (hashing, a preprocessing layer), or calls
        the block again, exchanges in the step."""
        if block_key in self.claimed:
            return None
        for name in feature_names:
            if name not in inputs or name not in self.batch or name not in self.following:
                return None
            given, fed = inputs[name], self.batch[name]
            if _per_sample(given) != _per_sample(fed) or not _same_tensor(
                _source(given), _source(fed)
            ):
                return None
        self.claimed.add(block_key)
        return {name: self.following[name] for name in feature_names}


def current_step() -> TrainingStep | None:
    """The training step being traced, or None (evaluate, predict, a custom loop)."""
    return _current.get()


def split_next(data):
    """``(data without the next batch, {feature: next batch's ids})``."""
    features = data[0] if isinstance(data, tuple) else data
    if not isinstance(features, dict) or not any(k.startswith(NEXT_KEY) for k in features):
        return data, {}
    plain = {k: v for k, v in features.items() if not k.startswith(NEXT_KEY)}
    following = {k[len(NEXT_KEY) + 1 :]: v for k, v in features.items() if k.startswith(NEXT_KEY)}
    return ((plain,) + tuple(data[1:]) if isinstance(data, tuple) else plain), following


@contextlib.contextmanager
def training_step(data):
    """Around one traced train step: yields ``data`` without the next batch, with the step's
    :class:`TrainingStep` open for the blocks and the optimizer."""
    data, following = split_next(data)
    features = data[0] if isinstance(data, tuple) else data
    step = TrainingStep(batch=features if isinstance(features, dict) else {}, following=following)
    token = _current.set(step)
    try:
        yield data
    finally:
        _current.reset(token)
    if step.waiting:
        raise RuntimeError(
            "The embedding exchanges' backward of this training step was not completed: "
            "a gradient was computed outside the compiled optimizer's minimize(). Compile "
            "the model with the optimizer that computes its gradients, or create the block "
            "with merge_backward=False."
        )


def _per_sample(tensor):
    """A tensor's static shape per sample, size-1 axes left out (``[B]`` = ``[B, 1]``)."""
    shape = getattr(tensor, "shape", None)
    if shape is None or shape.rank is None or shape.rank < 1:
        return None
    return [d for d in shape.as_list()[1:] if d != 1]


def _source(tensor):
    while getattr(tensor, "op", None) is not None and tensor.op.type in SAME_VALUES:
        tensor = tensor.op.inputs[0]
    return tensor


def _same_tensor(a, b) -> bool:
    if a is b:
        return True
    try:
        return a.graph is b.graph and a.name == b.name
    except AttributeError:  # eager tensors have no graph: only the same object counts
        return False


__all__ = ["NEXT_KEY", "TrainingStep", "current_step", "split_next", "training_step"]
