"""The next batch's ids, sent one step ahead.

A step of the block on several ranks starts with an all-to-all of its batch's ids (with the
header that every rank checks); nothing else can start before it returns. With the next batch
in hand, step i instead sends batch i+1's ids and keeps what it received in variables; step
i+1 starts from them, its lookups at once (the way TorchRec's train pipeline starts the next
batch's input distribution early). Which collective carries them is the step schedule's
choice (:mod:`.schedule`): the rows' forward all-to-all where the step has one (every
collective costs a round of negotiation whatever its size), else one of their own. The
exchange still happens inside a step, so every rank runs it at the same point (a collective
in an input pipeline's thread could be left half-run on one rank when another stops reading).

Two halves:

- the input: :func:`pipelined` pairs each element of ``fit``'s ``tf.data`` input with the next
  batch's id features (one pass over the data: a ``scan`` that holds one batch back; the last
  batch is paired with an empty one, which tells every rank that nothing follows); the step's
  owner takes them out of the batch again (``backends/step.py``), so the model never sees them;
- the step: :class:`Lookahead` holds what arrived (the step's stages, :mod:`.pipeline`, send
  and keep it). The checks go with the ids: step i counts
  batch i+1's problems and sends the count in the header; step i+1 asserts them, as it would
  have, with this rank's first problem kept as a message. When nothing is kept (a first step,
  after a last batch, a new ``fit``) the step exchanges its own ids. The choice is a variable
  that every rank sets alike (from the headers every rank received), so every rank takes the
  same branch of every collective.

Extra memory: one batch held back in the input, and one batch's received ids kept per block
(ranks x (2 + batch x lookups served) integers).

Example:
    >>> train = pipelined(model, loader_dataset(ds, batch_size=512))  # doctest: +SKIP
    >>> received, splits = lookahead.kept_or(exchange_now, batch, rank, n)  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from merlin_models_de.backends.step import NEXT_KEY
from merlin_models_de.backends.validate import check_headers
from merlin_models_de.variables import embedding_blocks

# ---- the input: each batch paired with the next one's ids ----------------------------------


def eligible_features(model, element_spec) -> list:
    """The id features the steps of ``model`` can take ahead from data of ``element_spec``:
    those of every block that can use them (a backend that supports it, several ranks),
    when every feature of such a block, and every part of the element, is a dense tensor."""
    features = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    if not isinstance(features, dict) or not all(
        isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(element_spec)
    ):
        return []
    names = []
    for block in embedding_blocks(model):
        backend = getattr(block, "backend", None)
        if (
            backend is None
            or not backend.supports_ahead
            or backend.world_size < 2
            or not getattr(block, "exchange_ahead", True)
        ):
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
    first_state = tf.nest.map_structure(_zeros, spec)  # never emitted (skipped below)
    # a batch of 0 samples (also where the input's batch size is fixed, e.g.
    # ``batch(..., drop_remainder=True)``): the step after it keeps nothing
    # made inside the pipeline, not captured: TF 2.12's tf.data rewrites turn a captured
    # constant (``from_tensors``) into a placeholder, and every pass of every rank then logs
    # "Executor start aborting"
    after_last = tf.data.Dataset.range(1).map(
        lambda _: tf.nest.map_structure(lambda s: _zeros(s, samples=0), spec)
    )
    marked = dataset.concatenate(after_last)

    def paired_with_next(previous, element):
        # one function call per element (a scan, then skip the first output: the initial
        # state paired with the first batch); a filter and a map after it cost 2.6x as much.
        # The state's shapes are relaxed by the empty last batch: the batch itself keeps the
        # input's (the state only ever holds the first state or one of the input's batches).
        previous = tf.nest.map_structure(_with_shape, previous, spec)
        features = _features(previous, spec)
        following = _features(element, spec)
        features = {**features, **{f"{NEXT_KEY}/{name}": following[name] for name in names}}
        out = (features,) + tuple(previous[1:]) if isinstance(spec, tuple) else features
        return element, out

    paired = marked.scan(first_state, paired_with_next).skip(1)
    if count >= 0:
        paired = paired.apply(tf.data.experimental.assert_cardinality(count))
    return paired.prefetch(1)


def forget(model) -> None:
    """A new ``fit``: no block starts from ids kept by an earlier one."""
    for block in embedding_blocks(model):
        kept = getattr(getattr(block, "backend", None), "lookahead", None)
        if kept is not None:
            kept.forget()


def _features(element, spec):
    return element[0] if isinstance(spec, tuple) else element


def _zeros(spec, samples=None):
    """A value of ``spec``: unknown sizes 0, the leading one ``samples`` when given."""
    shape = [0 if d is None else d for d in spec.shape.as_list()]
    if samples is not None and shape:
        shape[0] = samples
    return tf.zeros(shape, spec.dtype) if spec.dtype != tf.string else tf.fill(shape, "")


def _with_shape(value, spec):
    value.set_shape(spec.shape)  # static only: no op runs
    return value


# ---- the step: what arrived, kept for the next one -------------------------------------------


class Lookahead:
    """The kept exchange of one backend: variables outside Keras' tracking (never saved),
    read and written by the step's stages (:mod:`.pipeline`).

    ``traced_steps`` counts the traced steps that sent a next batch (what a test asks of a
    ``fit``: did its step take the pipeline's ids)."""

    def __init__(self, world_size: int):
        self.traced_steps = 0
        with tf.init_scope():  # also when the block is built inside a traced step
            self.kept = tf.Variable(False, trainable=False, name="lookahead_kept")
            self.received = tf.Variable(
                tf.zeros([0], tf.int64),
                trainable=False,
                shape=tf.TensorShape([None]),
                name="lookahead_ids",
            )
            self.splits = tf.Variable(
                tf.zeros([world_size], tf.int32), trainable=False, name="lookahead_splits"
            )
            self.ok = tf.Variable(True, trainable=False, name="lookahead_ok")
            self.problem = tf.Variable("", trainable=False, name="lookahead_problem")

    def forget(self) -> None:
        """Nothing kept (a new ``fit``: its first batch is not the one kept)."""
        self.kept.assign(False)

    def kept_or(self, now, batch, rank: int, world_size: int):
        """``(received, received_splits)`` of this step's batch, checked on every rank: kept
        by the step before (its headers checked here), or ``now()``, the ids' exchange with
        its checks, when nothing was kept. The choice is a variable every rank sets alike."""

        def kept():
            received, splits = tf.identity(self.received), tf.identity(self.splits)
            checks = check_headers(
                received,
                splits,
                batch,
                rank,
                world_size,
                [(self.ok.read_value(), [self.problem.read_value()])],
            )
            with tf.control_dependencies(checks):
                return tf.identity(received), tf.identity(splits)

        return tf.cond(self.kept, kept, now)

    def keep(self, sent: "NextIds", received, splits) -> None:
        """Keeps what arrived of ``sent`` for the next step.

        It is kept only when every rank's next batch has samples, read from the headers, the
        same on every rank."""
        sizes = tf.gather(received, tf.cumsum(tf.cast(splits, tf.int64), exclusive=True))
        with tf.control_dependencies([sent.after]):  # this step read what was kept first
            self.received.assign(received)
            self.splits.assign(splits)
            self.ok.assign(sent.ok)
            self.problem.assign(sent.message)
            self.kept.assign(tf.reduce_all(sizes > 0))


@dataclass(frozen=True)
class NextIds:
    """The next batch's id message: to each rank, its header then the ids it serves."""

    payload: tf.Tensor  # int64, the segments of every rank in rank order
    splits: tf.Tensor  # int32 [ranks]: each segment's size
    ok: tf.Tensor  # this rank's next batch passed its local checks
    message: tf.Tensor  # else the first failing check, as one line
    after: tf.Tensor  # this step's received ids: read before anything is kept


def first_problem(deferred):
    """(all ok, the first failing check's data as one line) of ``[(ok, data)]`` checks."""
    if not deferred:
        return tf.constant(True), tf.constant("")
    oks = tf.stack([tf.convert_to_tensor(ok) for ok, _ in deferred])
    all_ok = tf.reduce_all(oks)

    def first_line():
        failing = tf.argmax(tf.cast(tf.logical_not(oks), tf.int32))
        return tf.gather(tf.stack([_line(data) for _, data in deferred]), failing)

    # the text is formatted only when a check fails: a dozen string ops a step otherwise
    return all_ok, tf.cond(all_ok, lambda: tf.constant(""), first_line)


def _line(data):
    parts = []
    for item in data:
        item = tf.convert_to_tensor(item)
        text = item if item.dtype == tf.string else tf.strings.as_string(item)
        text = tf.strings.reduce_join(tf.reshape(text, [-1]), separator=" ")
        parts.append(text if item.shape.rank == 0 else tf.strings.join(["[", text, "]"]))
    return tf.strings.reduce_join(tf.stack(parts), separator=" ")
