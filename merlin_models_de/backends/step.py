"""One training step's values, handed from the step's owner to the blocks and the optimizer.

Merlin's ``train_step`` calls the model, whose blocks call the embedding block, then
``optimizer.minimize``; none of those calls can carry an argument of ours. The step's owner
(the train-step hook, :func:`training_step`) therefore opens one :class:`TrainingStep` for the
duration of the traced step, and the two places that need it read it once, where the call
chain starts being ours:

- the block's ``call`` takes the next batch's ids for its features
  (:meth:`TrainingStep.next_batch_for`) and the list its exchanges' backward waits in
  (``waiting``), and passes both to its backend as arguments;
- the optimizer's gradient hook completes what waits (:func:`complete_waiting`), through the
  backend whose exchanges left it (:class:`Waiting`: a backend adds itself with each entry).

Everything further down receives these values as arguments. ``fit``'s input goes through the
backends of the model's blocks the same way (:func:`input_pipeline`): nothing above
``backends/`` names a backend. A step whose waiting backward was
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
from typing import Callable

from merlin_models_de.variables import embedding_blocks

NEXT_KEY = "__mmde_next"  # reserved feature keys of the input pipeline: f"{NEXT_KEY}/{feature}"
# ops whose output holds exactly their input's values, in order
SAME_VALUES = {"Identity", "ExpandDims", "Squeeze", "Reshape"}

_current: contextvars.ContextVar = contextvars.ContextVar("mmde_training_step", default=None)


class Waiting:
    """The exchanges of one training step whose backward waits for the optimizer, and the
    backend class that left them (its ``complete_backward`` completes them)."""

    def __init__(self):
        self.entries: list = []
        self.backend = None

    def add(self, backend, entry) -> None:
        """Keeps ``entry`` for ``backend`` (a backend class) to complete."""
        if self.backend is not None and self.backend is not backend:
            raise NotImplementedError(
                "One training step defers the exchanges' backward of one backend only; "
                f"blocks of backend={self.backend.name!r} and backend={backend.name!r} both "
                "do. Create the blocks of one of them with merge_backward=False."
            )
        self.backend = backend
        self.entries.append(entry)

    def take(self):
        """``(backend class, entries)``, leaving nothing waiting."""
        backend, entries = self.backend, self.entries
        self.backend, self.entries = None, []
        return backend, entries

    def __bool__(self) -> bool:
        return bool(self.entries)


@dataclass(frozen=True)
class KeyUpdates:
    """What a training call of a block does to its dynamic tables' key maps."""

    # var -> [(slot variable, initial value)] of the model's optimizer: what a row given to a
    # new key starts from (dynamic/reset.py); None outside fit (nothing to reset)
    optimizer_state: Callable | None = None
    # features given placeholder ids (a FeatureSelection's call): their keys are not counted
    placeholders: frozenset = frozenset()


@dataclass
class TrainingStep:
    """The values of one traced training step (see the module docstring)."""

    batch: dict  # the step's features, as the model receives them
    following: dict  # the next batch's id features, by feature name ({}: the input has none)
    waiting: Waiting = field(default_factory=Waiting)  # exchanges whose backward waits
    # var -> [(slot variable, initial value)] of the model's optimizer: what a dynamic
    # table's row given to a new key starts from (dynamic/reset.py)
    optimizer_state: Callable | None = None
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


def complete_waiting(grads, variables, local, name: str = "mmde_merged"):
    """``(grads, averaged)`` of the optimizer's gradient hook: what the step's exchanges left
    waiting, completed by the backend that left it (``averaged[i]`` True for the global
    gradients it averaged: the allreduce skips them). Nothing waits (no training step, or
    completed already): ``grads`` as given, none averaged."""
    step = current_step()
    if step is None or not step.waiting:
        return list(grads), [False] * len(grads)
    backend, entries = step.waiting.take()
    return backend.complete_backward(entries, grads, variables, local, name)


def input_pipeline(model, dataset):
    """``fit``'s input ``dataset`` as the backends of ``model``'s blocks take it (each backend
    class once, in the order of the blocks; unchanged by a backend that pairs nothing)."""
    classes = []
    for block in embedding_blocks(model):
        backend = getattr(block, "backend", None)
        if backend is not None and type(backend) not in classes:
            classes.append(type(backend))
    for cls in classes:
        dataset = cls.input_pipeline(model, dataset)
    return dataset


def split_next(data):
    """``(data without the next batch, {feature: next batch's ids})``."""
    features = data[0] if isinstance(data, tuple) else data
    if not isinstance(features, dict) or not any(k.startswith(NEXT_KEY) for k in features):
        return data, {}
    plain = {k: v for k, v in features.items() if not k.startswith(NEXT_KEY)}
    following = {k[len(NEXT_KEY) + 1 :]: v for k, v in features.items() if k.startswith(NEXT_KEY)}
    return ((plain,) + tuple(data[1:]) if isinstance(data, tuple) else plain), following


@contextlib.contextmanager
def training_step(data, optimizer_state: Callable | None = None):
    """Around one traced train step: yields ``data`` without the next batch, with the step's
    :class:`TrainingStep` open for the blocks and the optimizer (``optimizer_state``: see
    :attr:`TrainingStep.optimizer_state`)."""
    data, following = split_next(data)
    features = data[0] if isinstance(data, tuple) else data
    step = TrainingStep(
        batch=features if isinstance(features, dict) else {},
        following=following,
        optimizer_state=optimizer_state,
    )
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


__all__ = [
    "NEXT_KEY",
    "KeyUpdates",
    "TrainingStep",
    "Waiting",
    "complete_waiting",
    "current_step",
    "input_pipeline",
    "split_next",
    "training_step",
]
