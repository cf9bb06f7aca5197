"""Row-wise Adagrad written from its formula in NumPy (float64), independent of the package:
the reference the optimizer's tests compare against.

    acc_r += mean_j(G[r, j] ** 2);  W[r] -= lr * G[r] / (sqrt(acc_r) + eps)

``G`` is the step's dense gradient: every id's rows added up (duplicates summed), zero for
rows not looked up, which then keep their accumulator and values. Non-table variables:
element-wise Adagrad, ``acc += G ** 2``.
"""

import numpy as np


def dense_gradient(grad, shape) -> np.ndarray:
    """A TF gradient (``IndexedSlices`` or dense) as a dense float64 array, duplicates summed."""
    out = np.zeros(shape, np.float64)
    if hasattr(grad, "indices"):
        np.add.at(out, np.asarray(grad.indices), np.asarray(grad.values, np.float64))
    else:
        out += np.asarray(grad, np.float64)
    return out


class NumpyRowWiseAdagrad:
    """Trains ``tf.Variable`` s like ``RowWiseAdagrad`` would, in NumPy.

    Args:
        lr, initial, eps: The optimizer's hyper-parameters.
        is_table: ``is_table(var)`` says which variables are tables (updated by row).
    """

    def __init__(self, lr, initial=0.1, eps=1e-7, is_table=lambda var: var.shape.rank == 2):
        self.lr, self.initial, self.eps, self.is_table = lr, initial, eps, is_table
        self.acc = {}  # var ref -> float64 accumulator

    def apply_gradients(self, grads_and_vars):
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            w = var.numpy().astype(np.float64)
            g = dense_gradient(grad, w.shape)
            table = self.is_table(var)
            shape = (w.shape[0], 1) if table else w.shape
            acc = self.acc.setdefault(var.ref(), np.full(shape, self.initial, np.float64))
            acc += np.mean(g**2, axis=1, keepdims=True) if table else g**2
            var.assign((w - self.lr * g / (np.sqrt(acc) + self.eps)).astype(w.dtype))

    def accumulator(self, var) -> np.ndarray:
        return self.acc[var.ref()]
