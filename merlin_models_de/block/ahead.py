"""The next batch inside each training step, so that the step can start its id exchange.

A step of the block on several ranks starts with an all-to-all of its batch's ids, and its
lookups wait for it. With the next batch at hand, step i sends batch i+1's ids with its own
rows and step i+1 starts from what arrived (:mod:`merlin_models_de.backends.lookahead`; the
way TorchRec's train pipeline starts the next batch's input distribution early). This module
brings the next batch to the block under plain ``fit``:

- :func:`pipelined` pairs each element of ``fit``'s ``tf.data`` input with the next batch's
  id features (one pass over the data: a ``scan`` that holds one batch back; the last batch
  is paired with an empty one, which tells every rank that nothing follows);
- :func:`stashed`, around each traced ``train_step``, takes those features out of the batch
  (the model never sees them) and leaves them on the model's blocks;
- :func:`take`, in the block's call, hands them over when this call reads the step's batch:
  each of its inputs *is* the batch's feature (through ops that keep values: identity,
  reshape, expand / squeeze dims). A model that derives ids before the block (hashing, a
  preprocessing layer) exchanges in the step as before.

Extra memory: one batch held back in the input, and one batch's received ids kept per block
(ranks x (2 + batch x lookups served) integers).

Example:
    >>> train = pipelined(model, loader_dataset(ds, batch_size=512))  # doctest: +SKIP
"""
from __future__ import annotations

import contextlib

import tensorflow as tf

from merlin_models_de.variables import embedding_blocks

KEY = "__mmde_next"  # reserved feature keys: f"{KEY}/{feature}"
STASH_ATTR = "_mmde_next_batch"  # on a block while a step is traced: (batch, next batch)
USES_ATTR = "_mmde_next_batch_uses"  # on a block: traced steps that took the next batch
# ops whose output holds exactly their input's values, in order
SAME_VALUES = {"Identity", "ExpandDims", "Squeeze", "Reshape"}


def eligible_features(model, element_spec) -> list:
    """The id features the steps of ``model`` can take ahead from data of ``element_spec``:
    those of every block that can use them (a backend that supports it, several ranks),
    when every feature of such a block, and every part of the element, is a dense tensor."""
    features = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    if not isinstance(features, dict) or not all(
            isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(element_spec)):
        return []
    names = []
    for block in embedding_blocks(model):
        backend = getattr(block, "backend", None)
        if (backend is None or not backend.supports_ahead or backend.world_size < 2
                or not getattr(block, "exchange_ahead", True)):
            continue
        specs = [features.get(f.name) for f in block.features]
        if all(s is not None and s.dtype.is_integer for s in specs):
            names += [f.name for f in block.features if f.name not in names]
    return names


def pipelined(model, dataset):
    """``dataset`` with each element's features joined by the next batch's id features
    (``dataset`` itself when no block of ``model`` can use them)."""
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    spec = dataset.element_spec
    names = eligible_features(model, spec)
    if not names:
        return dataset
    count = int(dataset.cardinality())
    pack = (lambda *e: e) if isinstance(spec, tuple) else (lambda e: e)
    after_last = tf.nest.map_structure(_empty, spec)  # an empty batch: nothing follows
    marked = dataset.map(pack).concatenate(tf.data.Dataset.from_tensors(after_last))

    def hold_one_back(state, element):
        started, previous = state
        return (True, element), (started, previous, element)

    def joined(started, element, following):
        del started
        features = element[0] if isinstance(spec, tuple) else element
        extra = {f"{KEY}/{name}": _features(following, spec)[name] for name in names}
        features = {**features, **extra}
        return (features,) + tuple(element[1:]) if isinstance(spec, tuple) else features

    paired = (marked.scan((False, after_last), hold_one_back)
              .filter(lambda started, *_: started).map(joined))
    if count >= 0:
        paired = paired.apply(tf.data.experimental.assert_cardinality(count))
    return paired.prefetch(1)


def forget(model) -> None:
    """A new ``fit``: no block starts from ids kept by an earlier one."""
    for block in embedding_blocks(model):
        kept = getattr(getattr(block, "backend", None), "lookahead", None)
        if kept is not None:
            kept.forget()


@contextlib.contextmanager
def stashed(model, data):
    """Around a traced step: yields ``data`` without the next batch, which the model's blocks
    find (:func:`take`) while the step is traced."""
    features = data[0] if isinstance(data, tuple) else data
    if not isinstance(features, dict) or not any(k.startswith(KEY) for k in features):
        yield data
        return
    plain = {k: v for k, v in features.items() if not k.startswith(KEY)}
    following = {k[len(KEY) + 1:]: v for k, v in features.items() if k.startswith(KEY)}
    blocks = embedding_blocks(model)
    for block in blocks:
        setattr(block, STASH_ATTR, (plain, following))
    try:
        yield ((plain,) + tuple(data[1:])) if isinstance(data, tuple) else plain
    finally:
        for block in blocks:
            setattr(block, STASH_ATTR, None)


def take(block, inputs):
    """The next batch's features for this call of ``block`` on ``inputs``, or None: only for
    a call on the step's batch (see the module docstring), once per step."""
    stash = getattr(block, STASH_ATTR, None)
    backend = getattr(block, "backend", None)
    if stash is None or backend is None or backend.lookahead is None:
        return None
    batch, following = stash
    for f in block.features:
        if f.name not in inputs or f.name not in batch or f.name not in following:
            return None
        given, fed = inputs[f.name], batch[f.name]
        if (_per_sample(given) != _per_sample(fed)
                or not _same_tensor(_source(given), _source(fed))):
            return None
    setattr(block, STASH_ATTR, None)  # a second call in the step exchanges its own
    setattr(block, USES_ATTR, uses(block) + 1)
    return {f.name: following[f.name] for f in block.features}


def uses(block) -> int:
    """How many traced steps of ``block`` took the next batch."""
    return getattr(block, USES_ATTR, 0)


def _features(element, spec):
    return element[0] if isinstance(spec, tuple) else element


def _empty(spec):
    shape = [0 if d is None else d for d in spec.shape.as_list()]
    return tf.zeros(shape, spec.dtype) if spec.dtype != tf.string else tf.fill(shape, "")


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
