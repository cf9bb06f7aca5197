"""Row-wise Adagrad: one accumulator per embedding-table row, as FBGEMM / TorchRec keep it.

For a table row ``r`` (width ``d``) with gradient ``g_r`` in a step (a sparse gradient's
duplicate ids summed first)::

    acc_r += sum_j(g_r[j] ** 2) / d          # the mean over the row's d elements
    row_r -= lr * g_r / (sqrt(acc_r) + epsilon)

``acc`` starts at ``initial_accumulator_value``; rows a step does not look up keep both. The
state of a ``[rows, d]`` table is a ``[rows, 1]`` slot (``row_accumulator``): 1/d of Adagrad's.
Every other variable (dense layers, the block's scalars, tables of ``mm.Embeddings``) gets
Keras' element-wise Adagrad with the same hyper-parameters (slot ``accumulator``):
``acc += g ** 2; var -= lr * g / (sqrt(acc) + epsilon)``. Dense layers may keep an optimizer
of their own through ``mm.MultiOptimizer``.

Tables are the shard variables a ``DistributedEmbeddings`` block marks
(``variables.table_mark``). A table stored in 16 bits (the block's ``table_dtype``) is updated
in float32: its gradient rows are summed in float32, the accumulator is float32, and the new
row is stochastically rounded into the table (:mod:`merlin_models_de.kernels.rounding`). A
column-sliced table's mean is over the whole row: its holders add their slices' partial sums
in one collective per block and step (:mod:`.columns`).

Example:
    >>> model.compile(optimizer=RowWiseAdagrad(0.05))  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.kernels.rounding import is_narrow, random_bits, stochastic_round
from merlin_models_de.kernels.rowwise.columns import ColumnSums, column_sums, unique_rows
from merlin_models_de.kernels.rowwise.storable import agreed_storable
from merlin_models_de.kernels.scatter import after_values, write_rows
from merlin_models_de.variables import mark_row_state, table_mark

ROW_SLOT = "row_accumulator"
ELEMENT_SLOT = "accumulator"
# the key of this apply's column-sliced sums in Keras' apply_state, the dict an apply passes
# to every variable's update
COLUMN_SUMS = "mmde_rowwise_column_sums"
# ... and of its 16-bit tables' new rows, computed and checked before any is written
ROUNDED_ROWS = "mmde_rowwise_rounded_rows"


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class RowWiseAdagrad(tf.keras.optimizers.legacy.Optimizer):
    """Adagrad with one accumulator per table row (see the module docstring for the update).

    Args:
        learning_rate: A float or a Keras ``LearningRateSchedule``.
        initial_accumulator_value: Where every accumulator starts (>= 0).
        epsilon: Added to the square root of the accumulator (> 0).
        name: The optimizer's name.
        **kwargs: Keras' ``clipnorm``, ``clipvalue``, ``global_clipnorm``, ``decay``.
    """

    _HAS_AGGREGATE_GRAD = True

    def __init__(
        self,
        learning_rate=0.001,
        initial_accumulator_value=0.1,
        epsilon=1e-7,
        name="RowWiseAdagrad",
        **kwargs,
    ):
        if not initial_accumulator_value >= 0.0:
            raise ValueError(
                "RowWiseAdagrad's initial_accumulator_value must be >= 0. "
                f"Received: initial_accumulator_value={initial_accumulator_value!r}"
            )
        if not epsilon > 0.0:
            raise ValueError(f"RowWiseAdagrad's epsilon must be > 0. Received: epsilon={epsilon!r}")
        super().__init__(name, **kwargs)
        self._set_hyper("learning_rate", kwargs.get("lr", learning_rate))
        self._set_hyper("decay", self._initial_decay)
        self._initial_accumulator_value = float(initial_accumulator_value)
        self.epsilon = float(epsilon)

    def _create_slots(self, var_list):
        for var in var_list:
            init = tf.keras.initializers.Constant(self._initial_accumulator_value)
            mark = table_mark(var)
            if mark is None:
                self.add_slot(var, ELEMENT_SLOT, init)
                continue
            if not mark.whole or var.shape.rank != 2:
                raise ValueError(
                    f"RowWiseAdagrad needs one variable per shard of table '{mark.table}'; its "
                    f"backend merged several shards into {var.name!r}. Use "
                    f"backend='horovod'. Received: variable shape={var.shape}"
                )
            mark_row_state(self.add_slot(var, ROW_SLOT, init))

    def add_slot(self, var, slot_name, initializer="zeros", shape=None):
        """Keras' ``add_slot``; a row slot is ``[rows, 1]`` float32 whoever asks for it (Keras'
        SavedModel loader recreates slots by name, with the variable's shape and dtype)."""
        if slot_name != ROW_SLOT:
            return super().add_slot(var, slot_name, initializer, shape=shape)
        dtype = tf.float32 if is_narrow(var.dtype) else var.dtype  # 16-bit: float32 state
        return keras_compat.add_slot_as(
            super().add_slot, var, slot_name, initializer, [var.shape[0], 1], dtype
        )

    def _prepare_local(self, var_device, var_dtype, apply_state):
        super()._prepare_local(var_device, var_dtype, apply_state)
        apply_state[(var_device, var_dtype)].update(
            epsilon=tf.convert_to_tensor(self.epsilon, var_dtype),
            neg_lr_t=-apply_state[(var_device, var_dtype)]["lr_t"],
        )

    def _coefficients(self, var, apply_state):
        dtype = var.dtype.base_dtype
        key = (var.device, tf.float32 if is_narrow(dtype) else dtype)  # 16-bit: in float32
        return (apply_state or {}).get(key) or self._fallback_apply_state(*key)

    def _distributed_apply(self, distribution, grads_and_vars, apply_state, name):
        # the column-sliced tables' whole-row sums: one collective per block, on every rank,
        # before any variable's update (those run one variable at a time)
        grads_and_vars = list(grads_and_vars)
        apply_state = {**(apply_state or {}), COLUMN_SUMS: column_sums(grads_and_vars)}
        apply_state[ROUNDED_ROWS] = self._rounded_rows(grads_and_vars, apply_state)
        return super()._distributed_apply(distribution, grads_and_vars, apply_state, name)

    def _rounded_rows(self, grads_and_vars, apply_state) -> dict:
        """``{variable ref: (row ids, new accumulator rows, new 16-bit rows)}`` of the
        16-bit tables among ``grads_and_vars``: all computed first, then checked against the
        dtype's range by every rank together (``storable.agreed_storable``, one allgather),
        so that a row out of range on any rank stops every rank before anything is written."""
        planned = []
        for grad, var in grads_and_vars:
            if grad is None or table_mark(var) is None or not is_narrow(var.dtype):
                continue
            c = self._coefficients(var, apply_state)
            if table_mark(var).column_sliced:
                ids, rows, square_sums = self._column_sums(apply_state).of(var)
            else:
                ids, rows = unique_rows(grad, var)
                square_sums = tf.reduce_sum(tf.square(rows), axis=1)
            planned.append((var, ids, *self._new_rows(var, ids, rows, square_sums, c)))
        checks = agreed_storable([(p[0], p[3]) for p in planned], [v for _, v in grads_and_vars])
        # the rounding runs while the check's collective does; only the writes wait for it
        rounded = [
            (var, ids, acc_rows, self._rounded(var, ids, new))
            for var, ids, acc_rows, new in planned
        ]
        with tf.control_dependencies(checks):
            return {
                var.ref(): (ids, tf.identity(acc_rows), tf.identity(rows))
                for var, ids, acc_rows, rows in rounded
            }

    @staticmethod
    def _column_sums(apply_state) -> ColumnSums:
        return (apply_state or {}).get(COLUMN_SUMS) or ColumnSums()

    # ---- updates ---------------------------------------------------------------------------

    def _resource_apply_dense(self, grad, var, apply_state=None):
        c = self._coefficients(var, apply_state)
        mark = table_mark(var)
        if mark is None:
            return tf.raw_ops.ResourceApplyAdagradV2(
                var=var.handle,
                accum=self.get_slot(var, ELEMENT_SLOT).handle,
                lr=c["lr_t"],
                epsilon=c["epsilon"],
                grad=grad,
                use_locking=self._use_locking,
            )
        if is_narrow(var.dtype):
            return self._write_rounded(var, apply_state)
        if mark.column_sliced:
            return self._rows_update(var, *self._column_sums(apply_state).of(var), c)
        acc = self.get_slot(var, ROW_SLOT)
        mean = tf.reduce_sum(tf.square(grad), axis=1, keepdims=True) / mark.dim
        new = acc.assign_add(mean, use_locking=self._use_locking, read_value=True)
        step = grad * (c["neg_lr_t"] / (tf.sqrt(new) + c["epsilon"]))
        return var.assign_add(step, use_locking=self._use_locking, read_value=False)

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        mark = table_mark(handle)
        if mark is not None and is_narrow(handle.dtype):  # computed and checked already
            return self._write_rounded(handle, kwargs.get("apply_state"))
        if mark is not None and mark.column_sliced:  # summed with the whole-row sums
            apply_state = kwargs.get("apply_state")
            return self._rows_update(
                handle,
                *self._column_sums(apply_state).of(handle),
                self._coefficients(handle, apply_state),
            )
        return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices, **kwargs)

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        # indices are unique here (the base class summed duplicates)
        c = self._coefficients(var, apply_state)
        mark = table_mark(var)
        if mark is None:
            return tf.raw_ops.ResourceSparseApplyAdagradV2(
                var=var.handle,
                accum=self.get_slot(var, ELEMENT_SLOT).handle,
                lr=c["lr_t"],
                epsilon=c["epsilon"],
                grad=grad,
                indices=indices,
                use_locking=self._use_locking,
            )
        sums = tf.reduce_sum(tf.square(grad), axis=1)
        return self._rows_update(var, indices, grad, sums, c)

    def _rows_update(self, var, ids, rows, square_sums, c):
        """``acc[ids] += square_sums / dim``, then ``var[ids] -= lr * rows / (sqrt(acc) + eps)``
        (``ids`` unique, ``square_sums`` over the whole row): the rows gathered, updated and
        written back (``scatter.write_rows``)."""
        return self._write(var, ids, *self._new_rows(var, ids, rows, square_sums, c))

    def _new_rows(self, var, ids, rows, square_sums, c):
        """``(new accumulator rows, new rows)`` of the update :meth:`_rows_update` writes
        (float32 rows for a 16-bit table)."""
        acc = self.get_slot(var, ROW_SLOT)
        ids = after_values(ids, rows)  # the lookup fails first on a bad id, named
        acc_rows = tf.gather(acc, ids) + tf.expand_dims(square_sums, 1) / table_mark(var).dim
        step = rows * (c["neg_lr_t"] / (tf.sqrt(acc_rows) + c["epsilon"]))
        return acc_rows, tf.cast(tf.gather(var, ids), step.dtype) + step

    def _write_rounded(self, var, apply_state):
        """Writes a 16-bit table's rows and row state that :meth:`_rounded_rows` computed."""
        planned = (apply_state or {}).get(ROUNDED_ROWS, {})
        if var.ref() not in planned:
            raise ValueError(
                f"RowWiseAdagrad updates 16-bit table '{table_mark(var).table}' in "
                "apply_gradients only (its rows are checked on every rank before any is "
                f"written). Received: variable={var.name!r}"
            )
        return self._write(var, *planned[var.ref()])

    def _write(self, var, ids, acc_rows, rows):
        return tf.group(
            write_rows(self.get_slot(var, ROW_SLOT), ids, acc_rows), write_rows(var, ids, rows)
        )

    def _rounded(self, var, ids, rows):
        """float32 ``rows`` (the rows ``ids`` of ``var``) stochastically rounded to ``var``'s
        16-bit dtype, with noise drawn from the rows' places in the table and the step."""
        mark = table_mark(var)
        bits = random_bits(
            tf.cast(ids, tf.int64) + mark.first_row,
            mark.first_col,
            mark.cols,
            mark.dim,
            self.iterations,
            mark.table,
        )
        return stochastic_round(rows, var.dtype, bits)

    def get_config(self):
        config = super().get_config()
        config.update(
            learning_rate=self._serialize_hyperparameter("learning_rate"),
            decay=self._initial_decay,
            initial_accumulator_value=self._initial_accumulator_value,
            epsilon=self.epsilon,
        )
        return config
