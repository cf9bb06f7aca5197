"""Minimal stand-in for Google's fiddle, enough for Merlin Models' retrieval test helpers.

``Config(fn, *args, **kwargs)`` records a call; attributes read and write its arguments;
``build(cfg)`` calls it, building nested Configs first (one object per Config instance, as
fiddle shares built objects); ``__fn_or_cls__`` and ``__arguments__`` as in fiddle.
"""

import inspect


class Buildable:
    def __init__(self, fn_or_cls, *args, **kwargs):
        object.__setattr__(self, "__fn_or_cls__", fn_or_cls)
        try:
            sig = inspect.signature(fn_or_cls)
            bound = sig.bind_partial(*args, **kwargs)
            arguments = {}
            for key, value in bound.arguments.items():
                kind = sig.parameters[key].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(value)
                elif kind is inspect.Parameter.VAR_POSITIONAL:
                    arguments["__args__"] = list(value)
                else:
                    arguments[key] = value
        except (TypeError, ValueError):
            arguments = dict(kwargs)
            if args:
                arguments["__args__"] = list(args)
        object.__setattr__(self, "__arguments__", arguments)

    def __getattr__(self, name):
        args = object.__getattribute__(self, "__arguments__")
        if name in args:
            return args[name]
        fn = object.__getattribute__(self, "__fn_or_cls__")
        try:
            param = inspect.signature(fn).parameters.get(name)
        except (TypeError, ValueError):
            param = None
        if param is not None and param.default is not param.empty:
            return param.default
        raise AttributeError(name)

    def __setattr__(self, name, value):
        self.__arguments__[name] = value


class Config(Buildable):
    pass


class Partial(Buildable):
    pass


def build(cfg, _memo=None):
    memo = {} if _memo is None else _memo
    if isinstance(cfg, Buildable):
        if id(cfg) in memo:
            return memo[id(cfg)]
        args = {k: build(v, memo) for k, v in cfg.__arguments__.items() if k != "__args__"}
        pos = [build(v, memo) for v in cfg.__arguments__.get("__args__", [])]
        if isinstance(cfg, Partial):
            import functools

            out = functools.partial(cfg.__fn_or_cls__, *pos, **args)
        else:
            out = cfg.__fn_or_cls__(*pos, **args)
        memo[id(cfg)] = out
        return out
    if isinstance(cfg, (list, tuple)):
        return type(cfg)(build(v, memo) for v in cfg)
    if isinstance(cfg, dict):
        return {k: build(v, memo) for k, v in cfg.items()}
    return cfg
