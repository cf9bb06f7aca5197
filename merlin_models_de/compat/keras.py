"""Keras' private API: optimizer slot creation, layer-name counters, the seed generator
of unseeded initializers, ``fit``'s cached validation data, the checks in front of a plain
Keras model's ``compile`` and of Keras' optimizers' ``apply_gradients``, and legacy SGD's and
Adagrad's sparse updates of a table."""

from __future__ import annotations

import contextlib
import functools

from merlin_models_de.compat.registry import INSTANCE, declare, replace


def creates_slots_per_variable(optimizer) -> bool:
    """True for Keras' legacy optimizers (Horovod's wrappers of them included): they create a
    variable's slots when it first gets a gradient, so slots created ahead of the first step
    leave room for variables a model creates later. New-style optimizers build once."""
    return optimizer is not None and hasattr(optimizer, "_create_all_weights")


def create_optimizer_slots(optimizer, variables) -> None:
    """Creates ``optimizer``'s slot variables for ``variables`` now (before saving or restoring
    them), the way its first training step would; a no-op for slots that exist.

    Raises:
        NotImplementedError: naming the optimizer, when part of its state lives outside the
            variables it reports, so that no checkpoint could hold it: Keras' loss-scale
            wrappers (the dynamic loss scale) and new-style optimizers holding other variables
            (Keras 2.12's Nadam keeps ``u_product`` and a Python counter).
    """
    import tensorflow as tf

    from merlin_models_de.variables import optimizer_variables

    if optimizer is None:
        return
    name = type(optimizer).__name__
    if getattr(optimizer, "inner_optimizer", None) is not None:
        raise NotImplementedError(
            f"Checkpoints cannot hold the state of {name}: its dynamic loss scale lives "
            f"outside the optimizer's variables. Received: optimizer={name}"
        )
    if hasattr(optimizer, "optimizers_and_blocks"):  # Merlin's MultiOptimizer
        # The same assignment of variables to optimizers as its apply_gradients makes.
        optimizer.var_optimizer_dict = {}
        optimizer._get_trainable_variables_optimizer_dict(
            optimizer.optimizers_and_blocks, require_disjoint=True
        )
        optimizer._get_trainable_variables_optimizer_dict(
            optimizer.update_optimizers_and_blocks, require_disjoint=False
        )
        groups: dict = {}
        for var in variables:
            owner = optimizer.var_optimizer_dict.get(var.ref(), optimizer.default_optimizer)
            groups.setdefault(id(owner), (owner, []))[1].append(var)
        for owner, owned in groups.values():
            create_optimizer_slots(owner, owned)
        return
    if hasattr(optimizer, "_create_all_weights"):  # legacy Keras optimizers
        optimizer._create_all_weights(variables)
        return
    optimizer.build(variables)  # new-style Keras optimizers; builds once
    known = {v.ref() for v in optimizer_variables(optimizer)}
    # Hyperparameters are variables too, but not state: a restore on another world size
    # must keep the (scaled) learning rate it was compiled with.
    hyper = ("_iterations", "_learning_rate", "_current_learning_rate")
    hidden = sorted(
        attr
        for attr, value in vars(optimizer).items()
        if isinstance(value, tf.Variable) and attr not in hyper and value.ref() not in known
    )
    if hidden:
        raise NotImplementedError(
            f"Checkpoints cannot hold the state of {name}: it keeps {', '.join(hidden)} "
            f"outside its variables. Received: optimizer={name}"
        )


@contextlib.contextmanager
def keras_names_kept():
    """Layers made inside take names without moving Keras' name counters afterwards.

    Why: Horovod pairs collectives across ranks by name, and Keras derives the names of
    layers, variables and gradients from per-process counters (``dense_5``, ``model_1``).
    When rank 0 alone builds a model (the export's single-process copy), every layer any
    rank builds later (a loaded model, say) would be named differently on rank 0 than on the
    others, and their first broadcast or allreduce would wait forever.
    """
    from keras import backend

    counters = backend.get_default_graph_uid_map()
    saved, observed = dict(counters), set(backend.OBSERVED_NAMES)
    try:
        yield
    finally:
        counters.clear()
        counters.update(saved)
        backend.OBSERVED_NAMES.clear()
        backend.OBSERVED_NAMES.update(observed)


def _keras_seed_generator():
    """Keras' own seed generator (a ``random.Random``) after ``set_random_seed``, else None."""
    from keras import backend

    return getattr(backend._SEED_GENERATOR, "generator", None)


def initializer_seeds() -> tuple:
    """``(base, shared)`` for the shards' initializer seeds, drawn from the generator Keras'
    unseeded initializers draw from. ``shared`` is the draw from Keras' own generator, the
    same on every rank after ``set_random_seed`` on every rank, else None; ``base`` is it,
    or else a draw from Python's ``random`` (this process's own)."""
    import random

    own = _keras_seed_generator()
    shared = own.randint(1, int(1e9)) if own is not None else None
    return (shared if shared is not None else random.randint(1, int(1e9))), shared


@contextlib.contextmanager
def same_randomness_on_every_rank(draws: int):
    """Whatever runs inside leaves Keras' seed generators as ``draws`` seeds would.

    Why: an unseeded Keras initializer draws its seed from Python's ``random`` (or Keras'
    own generator after ``set_random_seed``) when it first runs, so a rank that initializes
    more shards draws more seeds, and every layer built afterwards (a model's dense layers)
    would start from different weights on different ranks, although every rank set the same
    seed. Here the generators are rewound and advanced by ``draws`` (say, one per table) on
    every rank alike.
    """
    import random

    generators = [random]
    own = _keras_seed_generator()
    if own is not None:
        generators.append(own)
    states = [g.getstate() for g in generators]
    try:
        yield
    finally:
        for generator, state in zip(generators, states):
            generator.setstate(state)
            for _ in range(draws):
                generator.randint(1, int(1e9))


class UntrackedSublayersMixin:
    """A Keras layer whose ``untracked_sublayers()`` Keras and Merlin see when they walk it
    (``_flatten_modules``: ``submodules``, the ``trainable`` setter, weights of children,
    Merlin's ``get_blocks_by_name`` / ``MultiOptimizer``), although the layer does not track
    them: tracked, they would become checkpoint dependencies of their own."""

    def untracked_sublayers(self) -> list:
        return []

    def _flatten_modules(self, recursive=True, include_self=True):
        yield from super()._flatten_modules(recursive=recursive, include_self=include_self)
        for layer in self.untracked_sublayers():
            if recursive:
                yield from layer._flatten_modules(recursive=True, include_self=True)
            else:
                yield layer


def hand_over_weights(owner, holder, variables) -> None:
    """Lists ``variables`` (created by ``owner.add_weight``) as ``holder``'s trainable
    weights instead of ``owner``'s; ``owner`` keeps tracking them (checkpoints unchanged).
    Keras then counts, trains or freezes them with ``holder``."""
    refs = {v.ref() for v in variables}
    for attr in ("_trainable_weights", "_non_trainable_weights"):
        kept = [v for v in getattr(owner, attr) if v.ref() not in refs]
        getattr(owner, attr)[:] = kept
    known = {v.ref() for v in holder._trainable_weights}
    holder._trainable_weights.extend(v for v in variables if v.ref() not in known)


def retrack(owner, old, new) -> None:
    """``owner`` (a Keras optimizer) tracks ``new`` under the name it tracked ``old`` by
    (Merlin's MultiOptimizer names its optimizers ``Optimizer<i>``), so checkpoints of
    ``owner`` hold the optimizer that now trains."""
    for ref in list(owner._self_unconditional_checkpoint_dependencies):
        if ref.ref is old:
            owner._track_trackable(new, name=ref.name, overwrite=True)


_COMPUTE_GRADIENTS = declare(
    "merlin.models.tf.blocks.optimizer.MultiOptimizer._compute_gradients",
    change="passes the (gradient, variable) pairs minimize() computes through the package's "
    "average over ranks before they are applied.",
    why="Merlin's MultiOptimizer is no Horovod optimizer; on several ranks its gradients of "
    "global variables must be averaged like those of hvd.DistributedOptimizer.",
    library="keras",
    scope=INSTANCE,
)


def wrap_compute_gradients(optimizer, after) -> None:
    """``optimizer.minimize`` passes the ``(gradient, variable)`` pairs it computes through
    ``after`` before applying them (Keras' legacy ``_compute_gradients``, on this instance)."""

    def wrap(compute):
        def computed(loss, var_list, grad_loss=None, tape=None):
            return after(compute(loss, var_list=var_list, grad_loss=grad_loss, tape=tape))

        return computed

    replace(_COMPUTE_GRADIENTS, optimizer, wrap)


def forget_validation_data(model) -> None:
    """Drops the validation data handler an earlier ``fit`` left on ``model``. Keras makes
    it at the first validation and deletes it when ``fit`` returns; a ``fit`` that raised
    leaves it, and the next ``fit`` would read the old data (on several ranks: an iterator
    left mid-way on some ranks, the next step's collectives waiting forever)."""
    if getattr(model, "_eval_data_handler", None) is not None:
        del model._eval_data_handler


def add_slot_as(add_slot, var, slot_name: str, initializer, shape, dtype):
    """A legacy optimizer's ``add_slot(var, ...)`` (the bound method ``add_slot``) whose slot
    holds ``dtype`` (Keras gives every slot its variable's dtype; a 16-bit table keeps float32
    optimizer state). The slot is found by ``var`` afterwards, as any other."""
    if var.dtype == dtype:
        return add_slot(var, slot_name, initializer, shape=shape)
    return add_slot(_WithDtype(var, dtype), slot_name, initializer, shape=shape)


class _WithDtype:
    """``var`` as ``add_slot`` reads it (its key, name, device, strategy), with another dtype."""

    def __init__(self, var, dtype):
        self.__dict__["_var"], self.__dict__["dtype"] = var, dtype

    def __getattr__(self, name):
        return getattr(self.__dict__["_var"], name)


_WHY_TABLES_16 = (
    "a 16-bit table shard trained by an optimizer other than RowWiseAdagrad would lose its "
    "small updates; refused before anything changes."
)
_NEW_APPLY = declare(
    "keras.optimizers.optimizer.Optimizer.apply_gradients",
    change="calls the package's check of the variables about to be updated, then Keras' own "
    "(which raises only for the package's 16-bit table shards).",
    why="custom loops call apply_gradients themselves: " + _WHY_TABLES_16,
    library="keras",
)
_LEGACY_APPLY = declare(
    "keras.optimizers.legacy.optimizer_v2.OptimizerV2.apply_gradients",
    change=_NEW_APPLY.change,
    why=_NEW_APPLY.why,
    library="keras",
)
_SGD_SPARSE = declare(
    "keras.optimizers.legacy.gradient_descent.SGD._resource_apply_sparse_duplicate_indices",
    change="adds a sparse gradient of the package's table shards in pieces, each Keras' own "
    "scatter-add (the same result); every other variable, and SGD with momentum, as Keras.",
    why="TF's CPU scatter-add loops over one table row by row on one thread: pieces run in "
    "parallel (docs/design.md, measured decisions).",
    library="keras",
)
_ADAGRAD_SPARSE = declare(
    "keras.optimizers.legacy.adagrad.Adagrad._resource_apply_sparse",
    change="updates the rows of the package's table shards outside a GPU by gathering and "
    "writing them back (the same floats as Keras' fused kernel); every other variable as "
    "Keras.",
    why="Keras' fused kernel walks a large table's rows on one thread on CPU.",
    library="keras",
)
_COMPILE = declare(
    "keras.engine.training.Model.compile",
    change="for a plain Keras model, checks the optimizer of the package's 16-bit tables "
    "first; for every model (Merlin's calling up included), loss and metrics pass through "
    "the package, which changes them only for an output of the package (a vocab-parallel "
    "output gets Merlin's loss and top-k metrics).",
    why="plain Keras models holding the block: " + _WHY_TABLES_16,
    library="keras",
)


def install_apply_check(check) -> None:
    """Has Keras' optimizers (new-style and legacy, and every subclass that does not replace
    ``apply_gradients`` without calling it) call ``check(optimizer, variables)`` with the
    variables an ``apply_gradients`` call is about to update, before it updates anything: at
    trace time inside a ``tf.function``, so custom loops are checked too. Idempotent."""
    import tensorflow as tf

    def wrap(original):
        @functools.wraps(original)
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            grads_and_vars = list(grads_and_vars)  # often a zip: read once here, once by Keras
            check(self, [v for _, v in grads_and_vars])
            return original(self, grads_and_vars, *args, **kwargs)

        return apply_gradients

    replace(_NEW_APPLY, tf.keras.optimizers.Optimizer, wrap)
    replace(_LEGACY_APPLY, tf.keras.optimizers.legacy.Optimizer, wrap)


def install_sgd_pieces(in_pieces, is_table) -> None:
    """Has Keras' legacy SGD without momentum (the scatter-add of a sparse gradient) add the
    gradient of a variable for which ``is_table(var)`` holds through ``in_pieces(scatter,
    var.device, indices, values)`` (``merlin_models_de.kernels.scatter``): Keras' own scatter-add of
    each piece, the result unchanged. With momentum SGD runs a fused kernel: untouched.
    Idempotent."""
    import tensorflow as tf

    def wrap(original):
        @functools.wraps(original)
        def apply(self, grad, var, indices, **kwargs):
            if self._momentum or not is_table(var):
                return original(self, grad, var, indices, **kwargs)
            return in_pieces(
                lambda ids, values: original(self, values, var, ids, **kwargs),
                var.device,
                indices,
                grad,
            )

        return apply

    replace(_SGD_SPARSE, tf.keras.optimizers.legacy.SGD, wrap)


def install_adagrad_rows(update, is_table) -> None:
    """Has Keras' legacy Adagrad update the rows of a variable for which ``is_table(var)``
    holds through ``update(var, accumulator, indices, grad, lr, epsilon)``
    (``merlin_models_de.kernels.scatter.adagrad_rows``, the same floats as Keras' fused kernel); every
    other variable as Keras has it. Keras deduplicates the indices before this call.
    Idempotent."""
    import tensorflow as tf

    def wrap(original):
        @functools.wraps(original)
        def apply(self, grad, var, indices, apply_state=None):
            if not is_table(var):
                return original(self, grad, var, indices, apply_state=apply_state)
            key = (var.device, var.dtype.base_dtype)
            coefficients = (apply_state or {}).get(key) or self._fallback_apply_state(*key)
            accumulator = self.get_slot(var, "accumulator")
            return update(
                var, accumulator, indices, grad, coefficients["lr_t"], coefficients["epsilon"]
            )

        return apply

    replace(_ADAGRAD_SPARSE, tf.keras.optimizers.legacy.Adagrad, wrap)


def install_compile_check(check, arguments=None) -> None:
    """Has ``tf.keras.Model.compile`` call ``check(model, optimizer)`` (the optimizer as
    given) before it compiles anything, for models whose class keeps Keras' ``compile``:
    Merlin's models have their own hook (``merlin_compat``), which runs before theirs calls
    Keras'. A refusal raised by ``check`` leaves the model as it was. With ``arguments``,
    every model's call (Merlin's calling up included) compiles with ``arguments(model,
    {"loss": ..., "metrics": ..., "weighted_metrics": ...})`` instead of those three, as
    given to Keras (Merlin's: one entry per output). Idempotent."""
    import inspect

    import tensorflow as tf

    def wrap(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def compile(self, optimizer="rmsprop", *args, **kwargs):  # noqa: A001 (Keras' name)
            if type(self).compile is compile:  # not a Merlin model calling up to Keras
                check(self, optimizer)
            if arguments is None:
                return original(self, optimizer, *args, **kwargs)
            bound = signature.bind(self, optimizer, *args, **kwargs)
            given = {n: bound.arguments.get(n) for n in ("loss", "metrics", "weighted_metrics")}
            bound.arguments.update(arguments(self, given))
            return original(*bound.args, **bound.kwargs)

        return compile

    replace(_COMPILE, tf.keras.Model, wrap)
