"""Every use of Merlin Models' and Horovod's private API, behind a version check.

What is patched, and when (the whole list; nothing else in the package touches private API):

- On the first ``DistributedEmbeddings`` construction (:func:`install_merlin_hooks`, called by
  :mod:`merlin_models_de.integration`): Merlin's ``BaseModel.compile``, ``BaseModel.evaluate``,
  ``BaseModel._add_horovod_callbacks`` and the ``save`` of every model class in
  ``merlin.models.tf.models.base`` are wrapped. The wrappers call the original for models
  without the block, or on one rank.
- :func:`distributed_optimizer` replaces two private methods of one
  ``hvd.DistributedOptimizer`` instance (``_allreduce_grads``, ``_allreduce``).
- :func:`create_optimizer_slots` calls a Keras optimizer's slot creation (Keras-private too;
  the only other Keras-private call is the layer walk in :mod:`merlin_models_de.variables`).
- :func:`take_local_rows` resets a Merlin ``Loader``'s sharding attributes.
- :func:`keras_names_kept` restores Keras' layer-name counters (``keras.backend``) after
  rank 0 alone builds layers (the export's copy of the model).
- :func:`same_randomness_on_every_rank` reads and restores the Python generators that Keras
  draws unseeded initializers' seeds from (``random`` and ``keras.backend._SEED_GENERATOR``).
- :func:`match_schemas` resets the ``_schema`` of layers of a ``from_config`` copy of a model
  (Merlin 23.8's ``SequentialBlock`` gives every later layer its first layer's schema on
  construction, so a copy is not the model it came from).

The installed versions are checked at first use (:func:`ensure_supported`): outside
:data:`SUPPORTED` the package stops with one message naming what it found, instead of
misbehaving later. ``MERLIN_MODELS_DE_SKIP_VERSION_CHECK=1`` turns the check off (at your risk).

Example:
    >>> from merlin_models_de import compat
    >>> compat.check_versions({"tensorflow": "2.12.1", "merlin-models": "23.8.0",
    ...                        "horovod": "0.28.1"})
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os

from merlin_models_de import comm

# distribution -> supported release prefixes (major.minor)
SUPPORTED = {"tensorflow": ("2.12",), "merlin-models": ("23.8",), "horovod": ("0.28",)}
SKIP_ENV = "MERLIN_MODELS_DE_SKIP_VERSION_CHECK"
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")
_MARK = "_mmde_hooks"
_state = {"checked": False}


class UnsupportedVersionError(RuntimeError):
    """An installed dependency is outside the versions this package was built against."""


def _version_of(distributions) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict:
    """``{name: version or None}`` for the dependencies in :data:`SUPPORTED`."""
    return {"tensorflow": _version_of(_TF_DISTRIBUTIONS),
            "merlin-models": _version_of(("merlin-models",)),
            "horovod": _version_of(("horovod",))}


def check_versions(installed: dict | None = None) -> None:
    """Raises :class:`UnsupportedVersionError` when an installed version is unsupported.

    Args:
        installed: ``{name: version}``; the installed versions by default. A missing
            Horovod (None) is fine: one process needs none.
    """
    installed = installed_versions() if installed is None else installed
    bad = []
    for name, prefixes in SUPPORTED.items():
        found = installed.get(name)
        if found is None and name == "horovod":
            continue
        if found is None or not any(found == p or found.startswith(p + ".") for p in prefixes):
            bad.append(f"{name} {found or 'not installed'} (supported: "
                       f"{', '.join(p + '.*' for p in prefixes)})")
    if bad:
        raise UnsupportedVersionError(
            "merlin_models_de does not support the installed " + "; ".join(bad) +
            f". Install the supported versions (ci/requirements.txt), or set {SKIP_ENV}=1 to "
            "skip this check at your own risk.")


def ensure_supported() -> None:
    """:func:`check_versions` once per process (unless turned off by the environment)."""
    if _state["checked"] or os.environ.get(SKIP_ENV) == "1":
        return
    check_versions()
    _state["checked"] = True


# ---- Merlin Models ----------------------------------------------------------------------------


def install_merlin_hooks(hooks) -> None:
    """Wraps Merlin's ``BaseModel`` methods with ``hooks`` (idempotent).

    ``hooks`` provides ``active(model)`` (adjust this model?), ``compile(original, model,
    optimizer, *args, **kwargs)``, ``evaluate(original, model, *args, **kwargs)``,
    ``fit_callbacks(model, callbacks)``, ``save(original, model, *args, **kwargs)`` and
    ``check_batches(model, method, data, steps)`` (before ``fit`` / ``evaluate`` /
    ``predict``) and ``before_fit(model)``.
    """
    ensure_supported()
    from merlin.models.tf.models import base as merlin_base

    model_cls = merlin_base.BaseModel
    if getattr(model_cls, _MARK, False):
        return
    compile_, evaluate_ = model_cls.compile, model_cls.evaluate
    fit_, predict_ = model_cls.fit, model_cls.predict
    add_callbacks = model_cls._add_horovod_callbacks  # pylint: disable=protected-access

    def compile(self, optimizer="rmsprop", *args, **kwargs):  # pylint: disable=redefined-builtin
        if not hooks.active(self):
            return compile_(self, optimizer, *args, **kwargs)
        return hooks.compile(compile_, self, optimizer, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        if not hooks.active(self):
            return evaluate_(self, x, *args, **kwargs)
        hooks.check_batches(self, "evaluate", x, kwargs.get("steps"))
        return hooks.evaluate(evaluate_, self, x, *args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        if hooks.active(self):
            hooks.check_batches(self, "fit", x, kwargs.get("steps_per_epoch"))
            hooks.before_fit(self)
        return fit_(self, x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        if hooks.active(self):
            hooks.check_batches(self, "predict", x, kwargs.get("steps"))
        return predict_(self, x, *args, **kwargs)

    def _add_horovod_callbacks(self, callbacks):
        callbacks = add_callbacks(self, callbacks)
        return hooks.fit_callbacks(self, callbacks) if hooks.active(self) else callbacks

    model_cls.compile, model_cls.evaluate = compile, evaluate
    model_cls.fit, model_cls.predict = fit, predict
    model_cls._add_horovod_callbacks = _add_horovod_callbacks  # pylint: disable=protected-access
    for cls in [c for c in vars(merlin_base).values()
                if isinstance(c, type) and issubclass(c, model_cls) and "save" in c.__dict__]:
        cls.save = _wrapped_save(cls.__dict__["save"], hooks)
    setattr(model_cls, _MARK, True)


def install_output_hooks(accepts, tie) -> None:
    """Lets Merlin's ``CategoricalOutput`` and ``ContrastiveOutput`` take more kinds of
    ``to_call`` (idempotent): where ``accepts(to_call)``, ``tie(output_cls, to_call, kwargs)``
    returns the ``(to_call, kwargs)`` Merlin is called with. Both classes test
    ``isinstance(to_call, EmbeddingTable)`` to tie weights; a block's table handle is no
    Keras layer, so it is translated before Merlin sees it."""
    ensure_supported()
    from merlin.models.tf.outputs.classification import CategoricalOutput
    from merlin.models.tf.outputs.contrastive import ContrastiveOutput

    for cls in (CategoricalOutput, ContrastiveOutput):
        if cls.__dict__.get(_MARK, False):
            continue
        cls.__init__ = _translating_init(cls, cls.__init__, accepts, tie)
        setattr(cls, _MARK, True)


def install_top_k_encoder_hook(top_k_layer) -> None:
    """Lets ``RetrievalModelV2.to_top_k_encoder()`` (no candidate dataset) work when the
    model's output is tied to a table no rank holds whole (idempotent): where
    ``top_k_layer(model, candidates, k)`` gives a Merlin ``TopKLayer`` (else None: Merlin's
    own path), the encoder scores that layer instead; it may also raise, refusing the call."""
    ensure_supported()
    from merlin.models.tf.core.encoder import TopKEncoder
    from merlin.models.tf.models.base import RetrievalModelV2
    from merlin.schema import Tags

    if RetrievalModelV2.__dict__.get(_MARK, False):
        return
    original = RetrievalModelV2.to_top_k_encoder

    @functools.wraps(original)
    def to_top_k_encoder(self, candidates=None, candidate_id=Tags.ITEM_ID,
                         strategy="brute-force-topk", k=10, **kwargs):
        layer = top_k_layer(self, candidates, k)
        if layer is None:
            return original(self, candidates, candidate_id, strategy, k, **kwargs)
        target = self.encoder._schema.select_by_tag(candidate_id).first.name
        return TopKEncoder(self.query_encoder, topk_layer=layer, k=k, target=target)

    RetrievalModelV2.to_top_k_encoder = to_top_k_encoder
    setattr(RetrievalModelV2, _MARK, True)


def _translating_init(cls, original, accepts, tie):
    @functools.wraps(original)
    def __init__(self, to_call=None, *args, **kwargs):
        if accepts(to_call):
            to_call, kwargs = tie(cls, to_call, kwargs)
        original(self, to_call, *args, **kwargs)

    return __init__


def _wrapped_save(original, hooks):
    def save(self, *args, **kwargs):
        if not hooks.active(self):
            return original(self, *args, **kwargs)
        return hooks.save(original, self, *args, **kwargs)

    return save


def take_local_rows(loader):
    """Makes a Merlin ``Loader`` read every row of its dataset on this rank.

    Under Horovod, ``mm.Loader`` shards by partition and broadcasts a shuffling seed; a
    dataset that already holds only this rank's rows needs neither. (Its constructor turns a
    ``global_rank`` of 0 into ``hvd.rank()``, so the attributes are reset afterwards.)
    """
    ensure_supported()
    loader.global_size, loader.global_rank, loader.seed_fn = 1, 0, None
    return loader


# ---- Horovod --------------------------------------------------------------------------------


def distributed_optimizer(optimizer, is_local):
    """``hvd.DistributedOptimizer`` around ``optimizer`` that registers every variable for
    which ``is_local(var)`` holds as local, and averages the other gradients with
    :func:`comm.average_gradients` (one grouped allreduce per dtype, named the same on every
    rank, so graph-mode steps pair up)."""
    ensure_supported()
    comm.hvd()  # initialized
    import horovod.tensorflow.keras as hvd_keras
    import tensorflow as tf

    wrapped = hvd_keras.DistributedOptimizer(optimizer, sparse_as_dense=True)
    allreduce = wrapped._allreduce  # pylint: disable=protected-access
    # Horovod's own reduce function puts each gradient's allreduce behind a tf.cond, in a
    # nested tf.function that autograph rewrites: ~1 s of the first step's tracing, and a
    # function call per gradient every step. comm's grouped average is plain graph code.
    average = tf.autograph.experimental.do_not_convert(comm.average_gradients)

    def generic_names(grads, variables=None, use_generic_names=True):
        del variables, use_generic_names
        return average(grads)

    def register_then_allreduce(grads, variables):
        for var in variables:
            if is_local(var):
                wrapped.register_local_var(var)
        return allreduce(grads, variables)

    wrapped._allreduce_grads = generic_names  # pylint: disable=protected-access
    wrapped._allreduce = register_then_allreduce  # pylint: disable=protected-access
    return wrapped


def is_horovod_optimizer(optimizer) -> bool:
    """True when ``optimizer`` is already one of Horovod's distributed optimizers."""
    return type(optimizer).__module__.startswith("horovod")


def is_horovod_broadcast_callback(callback) -> bool:
    """True for Horovod's ``BroadcastGlobalVariablesCallback`` (exactly that type)."""
    import horovod.tensorflow.keras as hvd_keras

    return type(callback) is hvd_keras.callbacks.BroadcastGlobalVariablesCallback


# ---- Keras ------------------------------------------------------------------------------------


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
            f"outside the optimizer's variables. Received: optimizer={name}")
    if hasattr(optimizer, "optimizers_and_blocks"):  # Merlin's MultiOptimizer
        # The same assignment of variables to optimizers as its apply_gradients makes.
        optimizer.var_optimizer_dict = {}
        optimizer._get_trainable_variables_optimizer_dict(  # pylint: disable=protected-access
            optimizer.optimizers_and_blocks, require_disjoint=True)
        optimizer._get_trainable_variables_optimizer_dict(  # pylint: disable=protected-access
            optimizer.update_optimizers_and_blocks, require_disjoint=False)
        groups: dict = {}
        for var in variables:
            owner = optimizer.var_optimizer_dict.get(var.ref(), optimizer.default_optimizer)
            groups.setdefault(id(owner), (owner, []))[1].append(var)
        for owner, owned in groups.values():
            create_optimizer_slots(owner, owned)
        return
    if hasattr(optimizer, "_create_all_weights"):  # legacy Keras optimizers
        optimizer._create_all_weights(variables)  # pylint: disable=protected-access
        return
    optimizer.build(variables)  # new-style Keras optimizers; builds once
    known = {v.ref() for v in optimizer_variables(optimizer)}
    # Hyperparameters are variables too, but not state: a restore on another world size
    # must keep the (scaled) learning rate it was compiled with.
    hyper = ("_iterations", "_learning_rate", "_current_learning_rate")
    hidden = sorted(attr for attr, value in vars(optimizer).items()
                    if isinstance(value, tf.Variable) and attr not in hyper
                    and value.ref() not in known)
    if hidden:
        raise NotImplementedError(
            f"Checkpoints cannot hold the state of {name}: it keeps {', '.join(hidden)} "
            f"outside its variables. Received: optimizer={name}")


# ---- TensorFlow / Keras checkpoints: the block's tables, whatever the layout ----------------
#
# A TF checkpoint (and the variables of a SavedModel) matches objects by the names of their
# dependencies. Named after this rank's layout (``mp_C1_c4``...), a block saved at one world
# size finds nothing to match at another. So the block has one dependency per table (see
# merlin_models_de/reload.py), given with the private Trackable hooks below.

VALUE_KEY = "VARIABLE_VALUE"  # what TF calls a variable's one saved tensor


def table_slice(storage, first_row, full_shape, start, size, dtype):
    """A stand-in variable for this rank's rectangle of one table in checkpoints.

    It saves the rectangle as a slice of a tensor of the table's full shape (the form of
    TF's partitioned variables), and restores by reading only that rectangle from whatever
    was saved (a whole table, or slices of it) into ``storage``. With ``storage`` None (no
    shard of the table here) it saves and reads nothing. It is itself an empty variable:
    functions in a SavedModel capture the table's variable, and only a variable can stand
    for it (they are never run; the block is rebuilt from its config).

    Args:
        storage: The variable holding the rectangle on this rank, or None.
        first_row: The rectangle's first row inside ``storage`` (backends may stack shards).
        full_shape: ``(rows, dim)`` of the whole table.
        start: ``(row, column)`` of the rectangle in the table.
        size: ``(rows, columns)`` of the rectangle.
        dtype: The table's dtype.
    """
    import tensorflow as tf

    stand_in = tf.Variable(tf.zeros([0, full_shape[1]], dtype), trainable=False,
                           name="mmde_table_slice")
    spec = " ".join(str(d) for d in full_shape) + " " + ":".join(
        f"{s},{n}" for s, n in zip(start, size))

    def rows():
        if first_row == 0 and tuple(storage.shape) == tuple(size):
            return storage
        return storage[first_row:first_row + size[0]]

    def serialize():
        return {} if storage is None else {VALUE_KEY: {spec: tf.convert_to_tensor(rows())}}

    def restore(restored_tensors):
        return tf.no_op() if storage is None else rows().assign(restored_tensors[VALUE_KEY])

    # TF looks these hooks up on the instance first (saveable_object_util)
    stand_in._serialize_to_tensors = serialize  # pylint: disable=protected-access
    stand_in._restore_from_tensors = restore  # pylint: disable=protected-access
    return stand_in


class TableCheckpointMixin:
    """Gives a Keras layer the checkpoint form it describes with two methods:

    ``checkpoint_children(children)`` -> the ``{name: trackable}`` to save, from Keras' own;
    ``checkpoint_dependency(name, found)`` -> the trackable a saved ``name`` stands for, given
    what Keras found under that name (None: nothing).
    """

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return self.checkpoint_children(super()._trackable_children(save_type, **kwargs))

    def _lookup_dependency(self, name, *args, **kwargs):
        return self.checkpoint_dependency(name, super()._lookup_dependency(name, *args, **kwargs))


def track_dependency(layer, name, trackable) -> None:
    """Tracks ``trackable`` as ``layer``'s dependency ``name`` (a restore that was waiting for
    that name, the model restored before it was built, happens now), and makes it the
    attribute ``name`` without Keras' attribute tracking: Keras' SavedModel loader sets every
    saved dependency it finds no attribute for, which would make a stand-in a weight."""
    layer._track_trackable(trackable, name=name, overwrite=True)  # pylint: disable=protected-access
    object.__setattr__(layer, name, trackable)


def deferred_dependency_names(layer) -> list:
    """Names of saved dependencies that a restore into the unbuilt ``layer`` is waiting for."""
    return list(layer._deferred_dependencies)  # pylint: disable=protected-access


def restore_deferred(layer, name, trackable) -> None:
    """Restores into ``trackable`` what a restore saved under ``name`` was waiting for (a
    saved name the layer does not track itself, such as an older layout's table name)."""
    layer._handle_deferred_dependencies(name=name, trackable=trackable)  # pylint: disable=protected-access


def match_schemas(original, copy, opaque=()) -> None:
    """Give each layer of ``copy`` (``original.__class__.from_config(original.get_config())``)
    no schema where its counterpart in ``original`` has none.

    Why: Merlin 23.8's ``SequentialBlock.__init__`` hands its first layer's schema to every
    later layer. Rebuilt from a config, a DLRM's ``WithShortcut`` (interaction + bottom MLP)
    thus gets the input schema, which it did not have, and from then on filters its inputs to
    the schema's columns: the bottom MLP's output is dropped. The copy still runs, but its
    config (what a SavedModel stores) now rebuilds a different model, which fails at load
    time. Layers are paired in Keras' traversal order, not entering ``opaque`` layer types
    (whose sublayers depend on the world size); a structural mismatch raises.
    """
    mine, theirs = _layers(original, opaque), _layers(copy, opaque)
    pairs = list(zip(mine, theirs))
    if len(mine) != len(theirs) or any(type(a) is not type(b) for a, b in pairs):
        raise ValueError("The model rebuilt from its config has a different structure; "
                         f"cannot export it. Received: {type(original).__name__}")
    for mine, theirs in pairs:
        if getattr(mine, "_schema", None) is None and getattr(theirs, "_schema", None) is not None:
            theirs._schema = None  # pylint: disable=protected-access


def _layers(layer, opaque) -> list:
    """The schema-holding sublayers of ``layer`` in Keras' order, each once, without the
    insides of ``opaque`` types (shared layers such as Merlin's context hold no schema)."""
    out, seen = [], set()

    def walk(parent):
        for child in parent._flatten_layers(include_self=False, recursive=False):  # pylint: disable=protected-access
            if id(child) in seen:
                continue
            seen.add(id(child))
            if hasattr(type(child), "has_schema"):
                out.append(child)
            if not isinstance(child, opaque):
                walk(child)

    walk(layer)
    return out


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

    return getattr(backend._SEED_GENERATOR, "generator", None)  # pylint: disable=protected-access


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
