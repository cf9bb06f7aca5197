"""Merlin Models' model and output classes patched (each through :mod:`.registry`): the hooks
of ``BaseModel``'s methods (and, on several ranks, transformer inputs padded as one
process pads them, and Keras' generator datasets read without tf.data's static rewrites,
:mod:`.tf_data`), the tied-output translation, the top-k encoder hook, and
``mm.DistributedEmbeddings`` served lazily by ``merlin.models.tf``."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect

from merlin_models_de.compat.registry import AT_IMPORT, INSTANCE, declare, replace
from merlin_models_de.compat.tf_data import install_quiet_generator_input
from merlin_models_de.compat.versions import ensure_supported

_BASE = "merlin.models.tf.models.base"
_INERT = "Models without the block, or in one process, get Merlin's own (after the checks)."


def _model_patch(name, change, why):
    return declare(f"{_BASE}.BaseModel.{name}", change=change, why=why, library="merlin-models")


_COMPILE = _model_patch(
    "compile",
    "checks the optimizer of the block's 16-bit tables first and tells the blocks the "
    "compiled optimizer's slots after; a model with the block on several ranks compiles "
    "with the package's distributed optimizer.",
    "Merlin's own wraps the optimizer in hvd.DistributedOptimizer, which would allreduce "
    "(and corrupt) sharded tables. " + _INERT,
)
_EVALUATE = _model_patch(
    "evaluate",
    "checks the block's features of the input; with the block on several ranks, reads a "
    "Merlin Dataset by rank, checks every rank has as many batches, sums metrics over ranks.",
    "each rank evaluates its share; results must equal one process's. " + _INERT,
)
_FIT = _model_patch(
    "fit",
    "checks the block's features of the input; with the block on several ranks, reads a "
    "Merlin Dataset by rank, checks batches across ranks, creates optimizer slots before "
    "the first step and brings each step the next batch's ids.",
    "an uneven input would leave ranks waiting in a collective forever. " + _INERT,
)
_PREDICT = _model_patch(
    "predict",
    "checks the block's features of the input; with the block on several ranks, reads a "
    "Merlin Dataset by rank and checks batches across ranks.",
    _FIT.why,
)
_TRAIN_STEP = _model_patch(
    "train_step",
    "opens the step's values for the block and its optimizer around Merlin's own step, and "
    "takes the next batch's ids (a feature only the package adds) out of the batch.",
    "the blocks' exchanges and the optimizer share one step; Keras' train_step passes no "
    "argument to carry it. Data without the package's features passes unchanged.",
)
_CALLBACKS = _model_patch(
    "_add_horovod_callbacks",
    "replaces Horovod's broadcast callback by one that skips sharded tables and their "
    "slots, and adds the report of ids outside their tables, for models with the block on "
    "several ranks.",
    "Horovod's broadcast would overwrite every rank's shard with rank 0's. " + _INERT,
)
_SAVES = {
    cls: declare(
        f"{_BASE}.{cls}.save",
        change="with the block on several ranks, every rank takes part and rank 0 writes a "
        "single-process SavedModel with full tables; in one process, an optimizer with row "
        "state (RowWiseAdagrad) is left out.",
        why="Merlin saves on rank 0 alone, which holds a shard of each table only; Keras "
        "cannot load row state back. Other models and optimizers: Merlin's own.",
        library="merlin-models",
    )
    for cls in ("BaseModel", "Model")
}
_FROM_CONFIGS = {
    cls: declare(
        f"{_BASE}.{cls}.from_config",
        change="runs Merlin's own inside the scope that binds tied outputs to tables by name.",
        why="a model rebuilt from its config (load_model, a copy) binds its outputs tied to "
        "the block to its own block. Without such outputs nothing differs.",
        library="merlin-models",
    )
    for cls in ("BaseModel", "Model", "RetrievalModelV2")
}
_OUTPUT_INITS = {
    module: declare(
        f"merlin.models.tf.outputs.{module}.{cls}.__init__",
        change="a table handle of the block given as to_call becomes the tied output layer; "
        "anything else passes through untouched.",
        why="Merlin ties weights only to an mm.EmbeddingTable (an isinstance test).",
        library="merlin-models",
    )
    for module, cls in (
        ("classification", "CategoricalOutput"),
        ("contrastive", "ContrastiveOutput"),
    )
}
_TRANSFORMER_INPUTS = declare(
    "merlin.models.tf.transformers.transforms.PrepareTransformerInputs.call",
    change="in fit / evaluate / predict of a model with the block on several ranks, pads "
    "ragged sequences to the longest sequence of every rank's batch (one allgather); "
    "otherwise Merlin's own.",
    why="Merlin gives the transformer no attention mask, so a sequence's outputs depend on "
    "how far its batch is padded: one process pads the global batch to its longest sequence.",
    library="merlin-models",
)
# set inside fit / evaluate / predict of a model with the block on several ranks
_ACROSS_RANKS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mmde_across_ranks", default=False
)
_TOP_K = declare(
    f"{_BASE}.RetrievalModelV2.to_top_k_encoder",
    change="without a candidate dataset, on an output tied to a sharded table, scores the "
    "table with ShardedTopK; refuses a candidate dataset with the block on several ranks; "
    "otherwise Merlin's own.",
    why="no rank holds a sharded table whole, and Merlin's dask encoding does not keep "
    "ranks in step.",
    library="merlin-models",
)
_CREATE_OPTIMIZER = declare(
    f"{_BASE}.BaseModel._create_optimizer",
    change="returns the optimizer as given, during one compile of a model with the block "
    "on several ranks (removed afterwards).",
    why="Merlin would wrap each optimizer of a MultiOptimizer the package already made "
    "distributed in hvd.DistributedOptimizer once more.",
    library="merlin-models",
    scope=INSTANCE,
)
_MODULE_GETATTR = declare(
    "merlin.models.tf.__getattr__",
    change="serves mm.DistributedEmbeddings (the package's block, loaded on first access); "
    "every other name as before. A one-shot finder on sys.meta_path adds it right after "
    "merlin.models.tf is imported.",
    why="mm.DistributedEmbeddings without importing Merlin Models (which initializes "
    "Horovod) or TensorFlow at import merlin_models_de.",
    library="merlin-models",
    when=AT_IMPORT,
)


def serve_lazily(module, name, load) -> None:
    """``module.<name>`` (a module-level ``__getattr__``, PEP 562) is ``load()``, loaded on
    first access; other names as before. Idempotent."""

    def wrap(current):
        def __getattr__(attribute):  # noqa: N807 (a module's __getattr__)
            if attribute == name:
                return load()
            if current is not None:
                return current(attribute)
            raise AttributeError(f"module {module.__name__!r} has no attribute {attribute!r}")

        return __getattr__

    # declared for Merlin Models: the only module served this way
    replace(_MODULE_GETATTR, module, wrap)


def install_merlin_hooks(hooks) -> None:
    """Wraps Merlin's ``BaseModel`` methods with ``hooks`` (idempotent).

    ``hooks`` provides ``active(model)`` (adjust this model?), ``compile(original, model,
    optimizer, *args, **kwargs)``, ``evaluate(original, model, *args, **kwargs)``,
    ``fit_callbacks(model, callbacks)``, ``save(original, model, *args, **kwargs)`` (on any
    number of ranks) and ``prepare(model, method, arguments)`` (before ``fit`` / ``evaluate`` /
    ``predict``: the call's arguments by name, returned checked and adjusted),
    ``rank_loader(method, data, batch_size, shuffle, loader_kwargs)`` (a
    Merlin ``Dataset`` given to them, as a ``Loader``), ``before_fit(model)``,
    ``before_compile(model, optimizer)`` (the optimizer as the user passed it, before Merlin
    or Keras compile anything), ``after_compile(model)`` (both on any number of ranks) and
    ``rebuild_scope()`` (a context around every model class's ``from_config``),
    ``check_inputs(model, method, arguments)`` (in one process, before ``fit`` / ``evaluate`` /
    ``predict``: the call's ``x`` / ``validation_data`` by name),
    ``fit_input(model, x)`` (the training data ``fit`` reads, for models whose class keeps
    Merlin's ``train_step``) and ``step_inputs(model, data)`` (a context around each traced
    ``train_step`` that yields the data the step sees); ``naming_silent_ranks()`` (a context
    around ``fit`` / ``evaluate`` / ``predict``: a failure caused by a silent rank names it);
    ``longest(length, name)`` (a collective: the largest of every rank's int64 ``[1]``
    ``length``, a scalar).
    """
    ensure_supported()
    merlin_base = importlib.import_module(_BASE)
    model = merlin_base.BaseModel
    replace(_COMPILE, model, lambda original: _compile(original, hooks))
    replace(_EVALUATE, model, lambda original: _evaluate(original, hooks))
    replace(_TRAIN_STEP, model, lambda original: _train_step(original, hooks))
    stepped = inspect.getattr_static(model, "train_step")
    replace(_FIT, model, lambda original: _fit(original, hooks, stepped))
    replace(_PREDICT, model, lambda original: _predict(original, hooks))
    replace(_CALLBACKS, model, lambda original: _callbacks(original, hooks))
    _install_global_padding(hooks)
    install_quiet_generator_input(_ACROSS_RANKS.get)
    for name, patch in _SAVES.items():
        replace(patch, getattr(merlin_base, name), lambda original: _wrapped_save(original, hooks))
    for name, patch in _FROM_CONFIGS.items():
        replace(
            patch,
            getattr(merlin_base, name),
            lambda original: _scoped_from_config(original.__func__, hooks),
        )


def _compile(original, hooks):
    def compile(self, optimizer="rmsprop", *args, **kwargs):  # noqa: A001 (Merlin's name)
        hooks.before_compile(self, optimizer)  # a refusal leaves the model as it was
        if not hooks.active(self):
            out = original(self, optimizer, *args, **kwargs)
        else:
            out = hooks.compile(original, self, optimizer, *args, **kwargs)
        hooks.after_compile(self)
        return out

    return compile


def _evaluate(original, hooks):
    def evaluate(self, x=None, *args, **kwargs):
        if not hooks.active(self):
            hooks.check_inputs(self, "evaluate", {"x": x})
            return original(self, x, *args, **kwargs)
        x, args, kwargs = _loaders_first(original, hooks, "evaluate", self, x, args, kwargs)
        with _across_ranks():
            return hooks.evaluate(original, self, x, *args, **kwargs)

    return hooks.naming_silent_ranks()(evaluate)  # a rank gone silent is named


def _fit(original, hooks, train_step):
    def fit(self, x=None, *args, **kwargs):
        if not hooks.active(self):
            hooks.check_inputs(self, "fit", {"x": x, **kwargs})
            return original(self, x, *args, **kwargs)
        x, args, kwargs = _loaders_first(original, hooks, "fit", self, x, args, kwargs)
        hooks.before_fit(self)
        if type(self).train_step is train_step:  # a subclass's own step would not unpack it
            x = hooks.fit_input(self, x)
        with _across_ranks():
            return original(self, x, *args, **kwargs)

    return hooks.naming_silent_ranks()(fit)  # a rank gone silent is named


def _train_step(original, hooks):
    def train_step(self, data):
        with hooks.step_inputs(self, data) as data:
            return original(self, data)

    return train_step


def _predict(original, hooks):
    def predict(self, x, *args, **kwargs):
        if not hooks.active(self):
            hooks.check_inputs(self, "predict", {"x": x})
            return original(self, x, *args, **kwargs)
        x, args, kwargs = _loaders_first(original, hooks, "predict", self, x, args, kwargs)
        with _across_ranks():
            return original(self, x, *args, **kwargs)

    return hooks.naming_silent_ranks()(predict)  # a rank gone silent is named


def _callbacks(original, hooks):
    def _add_horovod_callbacks(self, callbacks):
        callbacks = original(self, callbacks)
        return hooks.fit_callbacks(self, callbacks) if hooks.active(self) else callbacks

    return _add_horovod_callbacks


# Merlin 23.8 turns a Merlin Dataset into a Loader inside the method, with these shuffles
# (fit's own `shuffle` argument reaches only validation_data) and its **kwargs as the
# Loader's arguments
_DATASET_ARGUMENTS = {
    "fit": {"x": lambda a: True, "validation_data": lambda a: a.get("shuffle", True)},
    "evaluate": {"x": lambda a: False},
    "predict": {"x": lambda a: False},
}


def _loaders_first(original, hooks, method, model, x, args, kwargs):
    """``(x, args, kwargs)`` of a call to Merlin's ``method`` with every Merlin ``Dataset``
    argument already turned into a ``Loader`` by ``hooks.rank_loader(method, data,
    batch_size, shuffle, loader_kwargs)``, so that the batch checks see the loader the
    method will read, then through ``hooks.prepare``. The Loader's arguments are taken out
    of the call (Merlin's ``evaluate`` would also pass them on to Keras, which refuses
    them)."""
    bound = inspect.signature(original).bind(model, x, *args, **kwargs)
    arguments = bound.arguments
    extra = arguments.get("kwargs", {})
    made = False
    for name, shuffle in _DATASET_ARGUMENTS[method].items():
        given = arguments.get(name)
        loader = hooks.rank_loader(
            method, given, arguments.get("batch_size"), shuffle(arguments), extra
        )
        if loader is not given:
            arguments[name], made = loader, True
    if made:
        arguments["kwargs"] = {}
    hooks.prepare(model, method, arguments)
    return arguments["x"], bound.args[2:], bound.kwargs


@contextlib.contextmanager
def _across_ranks():
    token = _ACROSS_RANKS.set(True)
    try:
        yield
    finally:
        _ACROSS_RANKS.reset(token)


def _install_global_padding(hooks) -> None:
    """Inside :func:`_across_ranks`, Merlin's transformer inputs padded as one process pads
    the global batch: to ``hooks.longest(length, name)``, the longest sequence of every
    rank's batch (a collective; every rank runs the same model)."""
    import tensorflow as tf

    try:
        from merlin.models.tf.transformers.transforms import PrepareTransformerInputs
    except ImportError:  # no transformers package: no transformer block to pad for
        return

    def wrap(original):
        @functools.wraps(original)
        def call(self, inputs):
            out = original(self, inputs)
            if not (_ACROSS_RANKS.get() and isinstance(inputs, tf.RaggedTensor)):
                return out
            dense = out["inputs_embeds"]
            mask = getattr(dense, "_keras_mask", None)
            length = tf.shape(dense, out_type=tf.int64)[1:2]
            longest = hooks.longest(length, f"mmde_{self.name}_length")
            extra = longest - length[0]
            padded = tf.pad(dense, [[0, 0], [0, extra], [0, 0]])
            if mask is not None:  # the padding is no target
                padded._keras_mask = tf.pad(mask, [[0, 0], [0, extra]])
            return {"inputs_embeds": padded}

        return call

    replace(_TRANSFORMER_INPUTS, PrepareTransformerInputs, wrap)


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
        patch = _OUTPUT_INITS[cls.__module__.rpartition(".")[2]]
        replace(
            patch, cls, lambda original, cls=cls: _translating_init(cls, original, accepts, tie)
        )


def install_top_k_encoder_hook(top_k_layer) -> None:
    """Lets ``RetrievalModelV2.to_top_k_encoder()`` (no candidate dataset) work when the
    model's output is tied to a table no rank holds whole (idempotent): where
    ``top_k_layer(model, candidates, k)`` gives a Merlin ``TopKLayer`` (else None: Merlin's
    own path), the encoder scores that layer instead; it may also raise, refusing the call."""
    ensure_supported()
    from merlin.models.tf.core.encoder import TopKEncoder
    from merlin.models.tf.models.base import RetrievalModelV2
    from merlin.schema import Tags

    def wrap(original):
        @functools.wraps(original)
        def to_top_k_encoder(
            self,
            candidates=None,
            candidate_id=Tags.ITEM_ID,
            strategy="brute-force-topk",
            k=10,
            **kwargs,
        ):
            layer = top_k_layer(self, candidates, k)
            if layer is None:
                return original(self, candidates, candidate_id, strategy, k, **kwargs)
            target = self.encoder._schema.select_by_tag(candidate_id).first.name
            return TopKEncoder(self.query_encoder, topk_layer=layer, k=k, target=target)

        return to_top_k_encoder

    replace(_TOP_K, RetrievalModelV2, wrap)


def _translating_init(cls, original, accepts, tie):
    @functools.wraps(original)
    def __init__(self, to_call=None, *args, **kwargs):  # noqa: N807 (replaces Merlin's __init__)
        if accepts(to_call):
            to_call, kwargs = tie(cls, to_call, kwargs)
        original(self, to_call, *args, **kwargs)

    return __init__


def _scoped_from_config(original, hooks):
    """``from_config`` inside ``hooks.rebuild_scope()``: a model rebuilt from its config (by
    ``load_model`` or a copy) binds its outputs' table names to its own blocks."""

    @functools.wraps(original)
    def from_config(cls, *args, **kwargs):
        with hooks.rebuild_scope():
            return original(cls, *args, **kwargs)

    return classmethod(from_config)


def _wrapped_save(original, hooks):
    def save(self, *args, **kwargs):
        return hooks.save(original, self, *args, **kwargs)

    return save


@contextlib.contextmanager
def optimizer_as_given(model):
    """Inside, ``model.compile`` takes its optimizer as given: Merlin's ``_create_optimizer``
    wraps each optimizer of a ``MultiOptimizer`` in Horovod's (again, when they already are)."""
    replace(_CREATE_OPTIMIZER, model, lambda original: lambda optimizer: optimizer)
    try:
        yield
    finally:
        del model._create_optimizer  # the class's own again
