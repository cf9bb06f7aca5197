"""Merlin Models' private API: the model hooks, the output translation, the top-k encoder
hook, the loader's sharding attributes and the schemas of a ``from_config`` copy."""

from __future__ import annotations

import contextlib
import functools
import inspect

from merlin_models_de.compat.versions import ensure_supported

_MARK = "_mmde_hooks"


def install_merlin_hooks(hooks) -> None:
    """Wraps Merlin's ``BaseModel`` methods with ``hooks`` (idempotent).

    ``hooks`` provides ``active(model)`` (adjust this model?), ``compile(original, model,
    optimizer, *args, **kwargs)``, ``evaluate(original, model, *args, **kwargs)``,
    ``fit_callbacks(model, callbacks)``, ``save(original, model, *args, **kwargs)`` (on any
    number of ranks) and ``prepare(model, method, arguments)`` (before ``fit`` / ``evaluate`` / ``predict``: the
    call's arguments by name, returned checked and adjusted),
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
    around ``fit`` / ``evaluate`` / ``predict``: a failure caused by a silent rank names it).
    """
    ensure_supported()
    from merlin.models.tf.models import base as merlin_base

    model_cls = merlin_base.BaseModel
    if getattr(model_cls, _MARK, False):
        return
    compile_, evaluate_ = model_cls.compile, model_cls.evaluate
    fit_, predict_ = model_cls.fit, model_cls.predict
    add_callbacks = model_cls._add_horovod_callbacks
    train_step_ = model_cls.train_step

    def compile(self, optimizer="rmsprop", *args, **kwargs):  # noqa: A001 (Merlin's method name)
        hooks.before_compile(self, optimizer)  # a refusal leaves the model as it was
        if not hooks.active(self):
            out = compile_(self, optimizer, *args, **kwargs)
        else:
            out = hooks.compile(compile_, self, optimizer, *args, **kwargs)
        hooks.after_compile(self)
        return out

    def evaluate(self, x=None, *args, **kwargs):
        if not hooks.active(self):
            hooks.check_inputs(self, "evaluate", {"x": x})
            return evaluate_(self, x, *args, **kwargs)
        x, args, kwargs = _loaders_first(evaluate_, hooks, "evaluate", self, x, args, kwargs)
        return hooks.evaluate(evaluate_, self, x, *args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        if hooks.active(self):
            x, args, kwargs = _loaders_first(fit_, hooks, "fit", self, x, args, kwargs)
            hooks.before_fit(self)
            if type(self).train_step is train_step:  # a subclass's own step would not unpack it
                x = hooks.fit_input(self, x)
        else:
            hooks.check_inputs(self, "fit", {"x": x, **kwargs})
        return fit_(self, x, *args, **kwargs)

    def train_step(self, data):
        with hooks.step_inputs(self, data) as data:
            return train_step_(self, data)

    def predict(self, x, *args, **kwargs):
        if hooks.active(self):
            x, args, kwargs = _loaders_first(predict_, hooks, "predict", self, x, args, kwargs)
        else:
            hooks.check_inputs(self, "predict", {"x": x})
        return predict_(self, x, *args, **kwargs)

    def _add_horovod_callbacks(self, callbacks):
        callbacks = add_callbacks(self, callbacks)
        return hooks.fit_callbacks(self, callbacks) if hooks.active(self) else callbacks

    named = hooks.naming_silent_ranks()  # a failure from a rank gone silent names it
    model_cls.compile, model_cls.evaluate = compile, named(evaluate)
    model_cls.fit, model_cls.predict = named(fit), named(predict)
    model_cls.train_step = train_step
    model_cls._add_horovod_callbacks = _add_horovod_callbacks
    for cls in [
        c
        for c in vars(merlin_base).values()
        if isinstance(c, type) and issubclass(c, model_cls) and "save" in c.__dict__
    ]:
        cls.save = _wrapped_save(cls.__dict__["save"], hooks)
    for cls in [model_cls] + [
        c
        for c in vars(merlin_base).values()
        if isinstance(c, type)
        and issubclass(c, model_cls)
        and c is not model_cls
        and "from_config" in c.__dict__
    ]:
        cls.from_config = _scoped_from_config(cls.from_config.__func__, hooks)
    setattr(model_cls, _MARK, True)


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

    RetrievalModelV2.to_top_k_encoder = to_top_k_encoder
    setattr(RetrievalModelV2, _MARK, True)


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


def take_local_rows(loader):
    """Makes a Merlin ``Loader`` read every row of its dataset on this rank.

    Under Horovod, ``mm.Loader`` shards by partition and broadcasts a shuffling seed; a
    dataset that already holds only this rank's rows needs neither. (Its constructor turns a
    ``global_rank`` of 0 into ``hvd.rank()``, so the attributes are reset afterwards.)
    """
    ensure_supported()
    loader.global_size, loader.global_rank, loader.seed_fn = 1, 0, None
    return loader


def loader_rows(loader) -> int:
    """Rows a Merlin ``Loader`` reads on this rank (per pass): the cached count its own
    ``len`` is computed from. Call only when the loader has a partition for this rank."""
    ensure_supported()
    return int(loader._buff_len)


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
        raise ValueError(
            "The model rebuilt from its config has a different structure; "
            f"cannot export it. Received: {type(original).__name__}"
        )
    for mine, theirs in pairs:
        if getattr(mine, "_schema", None) is None and getattr(theirs, "_schema", None) is not None:
            theirs._schema = None


def _layers(layer, opaque) -> list:
    """The schema-holding sublayers of ``layer`` in Keras' order, each once, without the
    insides of ``opaque`` types (shared layers such as Merlin's context hold no schema)."""
    out, seen = [], set()

    def walk(parent):
        for child in parent._flatten_layers(include_self=False, recursive=False):
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
def optimizer_as_given(model):
    """Inside, ``model.compile`` takes its optimizer as given: Merlin's ``_create_optimizer``
    wraps each optimizer of a ``MultiOptimizer`` in Horovod's (again, when they already are)."""
    ensure_supported()
    model._create_optimizer = lambda optimizer: optimizer
    try:
        yield
    finally:
        del model._create_optimizer
