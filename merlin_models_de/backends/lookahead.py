"""The next batch's id exchange, run by this step and kept for the next one.

A step of the block on several ranks starts with an all-to-all of its batch's ids (with the
header that every rank checks); nothing else can start before it returns. With the next
batch in hand (``block/ahead.py`` pairs each batch with the next), step i instead sends batch
i+1's ids and keeps what it received in variables; step i+1 starts from them, its lookups at
once. The ids ride in step i's rows' forward all-to-all (after each rank's rows: every
collective costs a round of negotiation whatever its size), or go alone where the step has
none. The exchange still happens inside a step, so every rank runs it at the same point (a
collective in an input pipeline's thread could be left half-run on one rank when another
stops reading early).

The checks go with it: step i counts batch i+1's problems and sends the count in the header;
step i+1 asserts them, as it would have, with this rank's first problem kept as a message.
When nothing is kept (a first step, after a last batch, a new ``fit``) the step exchanges its
own ids as before. The choice is a variable that every rank sets alike (from the headers every
rank received), so every rank takes the same branch of every collective.

Example:
    >>> kept = Lookahead(backend)  # doctest: +SKIP
    >>> received, splits = kept.this_step(inputs, batch, problems)  # doctest: +SKIP
    >>> kept.send(kept.next_ids(inputs_next, problems_next, (received, splits)))  # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from merlin_models_de import comm
from merlin_models_de.backends.validate import batch_size, check_headers


class Lookahead:
    """The kept exchange of one backend (variables outside Keras' tracking: never saved)."""

    def __init__(self, backend):
        self.backend = backend
        with tf.init_scope():  # also when the block is built inside a traced step
            self.kept = tf.Variable(False, trainable=False, name="lookahead_kept")
            self.received = tf.Variable(tf.zeros([0], tf.int64), trainable=False,
                                        shape=tf.TensorShape([None]), name="lookahead_ids")
            self.splits = tf.Variable(tf.zeros([backend.world_size], tf.int32),
                                      trainable=False, name="lookahead_splits")
            self.ok = tf.Variable(True, trainable=False, name="lookahead_ok")
            self.problem = tf.Variable("", trainable=False, name="lookahead_problem")

    def forget(self) -> None:
        """Nothing kept (a new ``fit``: its first batch is not the one kept)."""
        self.kept.assign(False)

    def this_step(self, inputs, batch, problems):
        """(received, received_splits) of this step's batch, checked on every rank: kept by
        the step before, or exchanged now."""
        b = self.backend

        def kept():
            received, splits = tf.identity(self.received), tf.identity(self.splits)
            checks = check_headers(received, splits, batch, b.rank, b.world_size,
                                   [(self.ok.read_value(), [self.problem.read_value()])])
            with tf.control_dependencies(checks):
                return tf.identity(received), tf.identity(splits)

        def now():
            header, check = b.header_and_check(inputs, batch, problems)
            received, splits = b.send_ids(inputs, header, b.collective_name("ids"))
            with tf.control_dependencies(check(received, splits)):
                return tf.identity(received), tf.identity(splits)

        received, splits = tf.cond(self.kept, kept, now)
        return received, splits

    def next_ids(self, inputs, problems, after) -> "NextIds":
        """The next batch's id message, which this step sends (in one of the backend's
        exchanges, or alone: :meth:`send`); ``after``: this step's ``(received, splits)`` from
        :meth:`this_step`, checked.

        The message waits for this step's checks (a data dependency on their result): a step
        whose batch fails them fails on every rank before any rank sends, so no rank is left
        with a half-run collective that the next one would meet.

        Every step sends, also after the last batch (an empty one): ranks whose data ends at
        different steps (``steps_per_epoch`` below one rank's batches) still run the same
        collectives."""
        b = self.backend
        batch = batch_size(inputs)
        count, deferred = b.local_problem_checks(inputs, batch, problems)
        header = comm.after(tf.stack([batch, count]), after[0])
        payload, splits = b.id_message(inputs, header)
        ok, message = first_problem(deferred)
        return NextIds(payload, splits, ok, message, after[0])

    def keep(self, sent: "NextIds", received, splits) -> None:
        """Keeps what arrived of ``sent`` (by any of this step's exchanges) for the next step.

        It is kept only when every rank's next batch has samples, read from the headers, the
        same on every rank."""
        sent.delivered = True
        sizes = tf.gather(received, tf.cumsum(tf.cast(splits, tf.int64), exclusive=True))
        with tf.control_dependencies([sent.after]):  # this step read what was kept first
            self.received.assign(received)
            self.splits.assign(splits)
            self.ok.assign(sent.ok)
            self.problem.assign(sent.message)
            self.kept.assign(tf.reduce_all(sizes > 0))

    def send(self, sent: "NextIds") -> None:
        """``sent`` in an all-to-all of its own (no exchange of this step carried it)."""
        received, splits = comm.alltoall(sent.payload, sent.splits,
                                         name=self.backend.collective_name("ids_next"))
        self.keep(sent, received, splits)


@dataclass
class NextIds:
    """The next batch's id message: to each rank, its header then the ids it serves.

    A backend whose exchange of this step can carry it (the rows' forward all-to-all) sends it
    there and calls :meth:`Lookahead.keep` with what arrived; otherwise
    :meth:`Lookahead.send` sends it alone. Either way it is sent exactly once per step."""

    payload: tf.Tensor  # int64, the segments of every rank in rank order
    splits: tf.Tensor  # int32 [ranks]: each segment's size
    ok: tf.Tensor  # this rank's next batch passed its local checks
    message: tf.Tensor  # else the first failing check, as one line
    after: tf.Tensor  # this step's received ids: read before anything is kept
    delivered: bool = False


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
