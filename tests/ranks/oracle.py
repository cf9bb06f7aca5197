"""The correctness oracle (docs/design.md): N ranks with batch B == one process with batch N*B.

The reference here never touches Horovod: full tables as plain variables, TF's own lookups
(tf.gather, tf.nn.embedding_lookup_sparse), the global batch, a mean loss.
"""

import numpy as np
import tensorflow as tf
from merlin.schema import Schema

from merlin_models_de import comm
from merlin_models_de.kernels.rowwise.adagrad import RowWiseAdagrad
from merlin_models_de.planner import MODEL_PARALLEL
from tests.rowwise_reference import NumpyRowWiseAdagrad
from tests.schemas import cat

OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.legacy.SGD(0.5),
    "adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.3),
    "adam": lambda: tf.keras.optimizers.legacy.Adam(0.05),
    "rowwise_adagrad": lambda: RowWiseAdagrad(0.3),
}
# the one-process side's optimizer where it is not the same class: the package's own
# optimizers are checked against an implementation written apart from them
REFERENCE_OPTIMIZERS = {"rowwise_adagrad": lambda: NumpyRowWiseAdagrad(0.3)}


def mixed_schema():
    """One-hot tables of several sizes and widths, multi-hot features, a shared table."""
    return Schema(
        [
            cat("user", 1999),
            cat("item", 999),
            cat("city", 49),
            cat("device", 6),
            cat("tags", 299, multi_hot=True),
            cat("genres", 79, domain_name="genre", multi_hot=True),
            cat("fav_genre", 79, domain_name="genre"),
            cat("hist", 599, multi_hot=True),
        ]
    )


# un-pooled lists (sequence_combiner=None) next to a pooled one
SEQUENCE_COMBINERS = {"tags": None, "genres": "sum", "hist": None}
DIMS = {"user": 8, "item": 8, "city": 8, "device": 6, "tags": 8, "genre": 8, "hist": 6}
COMBINERS = {"tags": "mean", "genres": "sum", "hist": "sqrtn"}


def global_batch(features, tables, size, seed):
    """Random ids for ``size`` samples: arrays for one-hot, (values, lengths) for multi-hot."""
    rng = np.random.default_rng(seed)
    rows = {t.name: t.rows for t in tables}
    batch = {}
    for f in features:
        if f.multi_hot:
            lengths = rng.integers(0, 5, size)
            batch[f.name] = (rng.integers(0, rows[f.table], lengths.sum()), lengths)
        else:
            batch[f.name] = rng.integers(0, rows[f.table], size)
    return batch


def select(batch, lo, hi):
    """Samples [lo, hi) of a global batch as model inputs (ragged for multi-hot)."""
    out = {}
    for name, value in batch.items():
        if isinstance(value, tuple):
            values, lengths = value
            starts = np.concatenate([[0], np.cumsum(lengths)])
            out[name] = tf.RaggedTensor.from_row_lengths(
                tf.constant(values[starts[lo] : starts[hi]], tf.int64), lengths[lo:hi]
            )
        else:
            out[name] = tf.constant(value[lo:hi, None], tf.int64)  # [B, 1] as Merlin feeds
    return out


def global_tables(tables, seed):
    rng = np.random.default_rng(seed)
    return {t.name: rng.normal(0, 0.5, (t.rows, t.dim)).astype(np.float32) for t in tables}


def reference_forward(variables, features, inputs, layers=None, wire=None):
    """``layers``: ``{feature: layer}`` applied to a list feature's un-pooled rows (a Keras
    layer given as ``sequence_combiner``). ``wire``: ``(dtype, feature names)``: those
    features' rows (pooled, before any layer) and their gradients rounded to ``dtype``, as a
    block with ``exchange_dtype`` rounds what crosses ranks."""
    out = {}
    for f in features:
        out[f.name] = _reference_rows(variables, f, inputs[f.name])
        if wire and f.name in wire[1]:
            rows = out[f.name]
            rounded = lambda t: tf.cast(tf.cast(t, wire[0]), t.dtype)  # noqa: E731
            out[f.name] = (
                rows.with_flat_values(rounded(rows.flat_values))
                if isinstance(rows, tf.RaggedTensor)
                else rounded(rows)
            )
        if layers and f.name in layers:
            out[f.name] = layers[f.name](out[f.name])
    return out


def _reference_rows(variables, f, value):
    """One feature's rows: pooled ``[B, dim]``, or ragged ``[B, None, dim]`` un-pooled."""
    if f.multi_hot and f.combiner is None:
        return tf.gather(variables[f.table], value)
    if f.multi_hot:
        pooled = tf.nn.embedding_lookup_sparse(
            variables[f.table], value.to_sparse(), None, combiner=f.combiner
        )
        # TF drops trailing empty rows; pad back to the batch
        missing = value.nrows() - tf.shape(pooled, out_type=tf.int64)[0]
        return tf.pad(pooled, [[0, missing], [0, 0]])
    return tf.gather(variables[f.table], tf.squeeze(value, -1))


def loss_fn(outputs, features, probes, targets):
    """Mean over samples of sum over features (and over positions of un-pooled lists) of
    (out . probe - target)^2."""
    per_sample = 0.0
    for f in features:
        dot = tf.reduce_sum(outputs[f.name] * probes[f.name], axis=-1)
        if isinstance(dot, tf.RaggedTensor):
            per_sample += tf.reduce_sum((dot - targets[:, None]) ** 2, axis=1)
        else:
            per_sample += (dot - targets) ** 2
    return tf.reduce_mean(per_sample)


def to_numpy(value, lo=None, hi=None):
    """Samples [lo, hi) of an output as arrays: (values, row lengths) when ragged."""
    if lo is not None:
        value = value[lo:hi]
    if isinstance(value, tf.RaggedTensor):
        return value.flat_values.numpy(), value.row_lengths().numpy()
    return np.asarray(value)


def make_probes(features, tables, seed):
    rng = np.random.default_rng(seed)
    dims = {t.name: t.dim for t in tables}
    return {f.name: tf.constant(rng.normal(size=dims[f.table]), tf.float32) for f in features}


def run_reference(
    block,
    arrays,
    batch,
    n_total,
    optimizer,
    steps,
    probes,
    targets,
    extra_loss=None,
    frozen=(),
    layers=None,
    wire=None,
):
    """One process, global batch: returns (first outputs, per-step losses, final tables).

    ``extra_loss(variables, outputs)`` is added to the loss (regularization, as Keras adds
    ``model.losses``); tables named in ``frozen`` are not trained; ``layers`` as in
    :func:`reference_forward`.
    """
    variables = {name: tf.Variable(a) for name, a in arrays.items()}
    inputs = select(batch, 0, n_total)
    first = dict(reference_forward(variables, block.features, inputs, layers, wire))
    opt, losses = REFERENCE_OPTIMIZERS.get(optimizer, OPTIMIZERS[optimizer])(), []
    trained = [v for name, v in variables.items() if name not in frozen]
    for _ in range(steps):
        with tf.GradientTape() as tape:
            outputs = reference_forward(variables, block.features, inputs, layers, wire)
            loss = loss_fn(outputs, block.features, probes, tf.constant(targets, tf.float32))
            if extra_loss is not None:
                loss += extra_loss(variables, outputs)
        grads = tape.gradient(loss, trained)
        opt.apply_gradients(zip(grads, trained))
        losses.append(float(loss))
    return first, losses, {k: v.numpy() for k, v in variables.items()}


def run_distributed(
    block,
    arrays,
    batch,
    per_rank,
    optimizer,
    steps,
    probes,
    targets,
    graph=False,
    via_optimizer=False,
):
    """This rank's share of the batch through ``block``: (first outputs, losses, tables).

    With ``graph`` the training step runs as a ``tf.function`` (as Keras fit does). With
    ``via_optimizer`` the step is ``minimize`` of the optimizer ``compile`` makes (its
    learning rate not scaled), whose rows' backward waits for the dense average (one
    all-to-all; backends/horovod/backward.py), inside the training step it opens
    (backends/step.py); otherwise the gradients come from the package's
    distributed tape, as in a custom loop.
    """
    from merlin_models_de.backends.step import complete_waiting, training_step
    from merlin_models_de.compat.horovod import distributed_optimizer
    from merlin_models_de.merlin.training import DistributedGradientTape
    from merlin_models_de.variables import is_local

    r = comm.rank()
    inputs = select(batch, r * per_rank, (r + 1) * per_rank)
    local_targets = tf.constant(targets[r * per_rank : (r + 1) * per_rank], tf.float32)
    block(inputs)
    block.set_global_weights(arrays)
    first = {k: to_numpy(v) for k, v in block(inputs).items()}
    opt, losses = OPTIMIZERS[optimizer](), []
    if via_optimizer:
        opt = distributed_optimizer(opt, is_local, merged=complete_waiting)

    def step(x):
        if via_optimizer:  # the step's owner opens it, as Merlin's train step hook does
            with training_step(x) as x:
                with tf.GradientTape() as tape:
                    loss = loss_fn(block(x, training=True), block.features, probes, local_targets)
                    if block.losses:
                        loss += tf.add_n(block.losses)
                opt.minimize(loss, block.trainable_variables, tape=tape)
            return loss
        with tf.GradientTape() as tape:
            loss = loss_fn(block(x, training=True), block.features, probes, local_targets)
            if block.losses:  # regularization: differentiated with the loss, as Keras' fit
                loss += tf.add_n(block.losses)
        tape = DistributedGradientTape(tape, block)
        grads = tape.gradient(loss, block.trainable_variables)
        opt.apply_gradients(zip(grads, block.trainable_variables))
        return loss

    step = tf.function(step) if graph else step
    for _ in range(steps):
        losses.append(float(comm.allreduce(step(inputs))))
    return first, losses, block.get_global_weights()


def exchanged_rows(block):
    """``(dtype, features)`` the block rounds in its exchange (see ``reference_forward``):
    those of model-parallel tables, when it has an ``exchange_dtype``."""
    if block.exchange_dtype is None:
        return None
    return block.exchange_dtype, {
        f.name for f in block.features if block.plan.kind_of(f.table) in MODEL_PARALLEL
    }


def assert_matches_oracle(
    block,
    optimizer,
    seed,
    extra_loss=None,
    frozen=(),
    layers=None,
    graph=False,
    per_rank=16,
    steps=3,
    via_optimizer=False,
):
    """Forward, per-step total losses and trained tables equal one process on the global batch;
    tables in ``frozen`` keep their initial values exactly, every other table trains (so the
    comparison means something). ``extra_loss(variables, outputs)``: the regularization the
    reference adds, checked to be a real share of the loss."""
    n, r = comm.size(), comm.rank()
    total = n * per_rank
    tables = block.tables
    arrays = global_tables(tables, seed)
    batch = global_batch(block.features, tables, total, seed + 1)
    probes = make_probes(block.features, tables, seed + 2)
    targets = np.random.default_rng(seed + 3).normal(size=total).astype(np.float32)
    wire = exchanged_rows(block)
    ref_first, ref_losses, ref_tables = run_reference(
        block,
        arrays,
        batch,
        total,
        optimizer,
        steps,
        probes,
        targets,
        extra_loss=extra_loss,
        frozen=frozen,
        layers=layers,
        wire=wire,
    )
    if wire:  # the rounding is real: the unrounded reference trains differently
        exact = run_reference(
            block,
            arrays,
            batch,
            total,
            optimizer,
            steps,
            probes,
            targets,
            extra_loss=extra_loss,
            frozen=frozen,
            layers=layers,
        )[1]
        assert not np.allclose(exact, ref_losses, rtol=1e-5, atol=0), (exact, ref_losses)
    first, losses, got_tables = run_distributed(
        block,
        arrays,
        batch,
        per_rank,
        optimizer,
        steps,
        probes,
        targets,
        graph=graph,
        via_optimizer=via_optimizer,
    )
    for name, want in ref_first.items():
        want = to_numpy(want, r * per_rank, (r + 1) * per_rank)
        got = first[name]
        if isinstance(want, tuple):  # un-pooled: same row lengths, same rows
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"row lengths {name}")
            got, want = got[0], want[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"forward {name}")
    if extra_loss is not None:  # the regularization is a real share of the loss it checks
        main = run_reference(
            block,
            arrays,
            batch,
            total,
            optimizer,
            1,
            probes,
            targets,
            frozen=frozen,
            layers=layers,
            wire=wire,
        )[1][0]
        assert ref_losses[0] > 1.05 * main, (ref_losses[0], main)
    np.testing.assert_allclose(
        losses,
        ref_losses,
        rtol=1e-5,
        atol=1e-6,
        err_msg="total loss per step (main + regularization)",
    )
    for name, want in ref_tables.items():
        if name in frozen:  # never touched, on any rank
            np.testing.assert_array_equal(got_tables[name], arrays[name], err_msg=name)
            continue
        np.testing.assert_allclose(
            got_tables[name],
            want,
            rtol=1e-4,
            atol=2e-6,
            err_msg=f"table {name} after {steps} {optimizer} steps",
        )
        assert not np.allclose(want, arrays[name]), f"table {name} did not train"
