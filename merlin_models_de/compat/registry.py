"""The registry of every patch the package makes: an attribute (a method, a module function)
of Keras, Merlin Models, Horovod or TensorFlow replaced by the package's own.

Each patch is declared once, beside the code that makes it (:func:`declare`, when its compat
module is imported), and made only through :func:`replace`, which refuses a patch that was not
declared or an owner that is not the declared target. So the list (:func:`declared`) is whole
before any patch goes in, including the ones made only on several ranks or by the launcher,
and docs/training.md's list is :func:`markdown` of it (tests/unit/test_patches.py checks both).

No TensorFlow, Merlin or Horovod import here: the package's import declares its own patch of
Merlin's module before either is loaded.
"""

from __future__ import annotations

import dataclasses
import inspect

from merlin_models_de.compat.versions import SUPPORTED, ensure_supported

# where a patch lives: on a class or module, for the whole process, or on one object the
# package made (an optimizer it wraps, a model while it compiles, a checkpoint stand-in)
PROCESS, INSTANCE = "process", "instance"
# when the process-wide ones go in
AT_MERLIN_IMPORT = "when merlin.models.tf is imported (after import merlin_models_de)"
AT_IMPORT = "at import merlin_models_de"
IN_LAUNCHER = "in horovodrun's launcher and elastic workers given a network interface"
ON_USE = "when the package makes the object"

# distributions whose releases TF's Keras follows: Keras 2.12 ships with TensorFlow 2.12
_CHECKED_AS = {"keras": "tensorflow"}


@dataclasses.dataclass(frozen=True)
class Patch:
    """One declared patch.

    Attributes:
        target: What is replaced, ``module.qualname.attribute`` (for an instance patch, the
            class of the objects whose attribute is set on the object itself).
        change: What the replacement does instead of the original.
        why: Why the package needs it.
        versions: The releases it is checked for (``ensure_supported`` before it goes in).
        scope: :data:`PROCESS` or :data:`INSTANCE`.
        when: When it goes in.
    """

    target: str
    change: str
    why: str
    versions: tuple
    scope: str
    when: str

    @property
    def attribute(self) -> str:
        return self.target.rpartition(".")[2]


_NONE = object()
_declared: dict = {}  # target -> Patch, in declaration order
_installed: dict = {}  # target -> the replacement in place (process-wide patches)


def declare(target, *, change, why, library, scope=PROCESS, when=AT_MERLIN_IMPORT) -> Patch:
    """Declares a patch (once per target; declaring the same one again returns it).

    Args:
        library: The distribution patched (``"keras"``, ``"merlin-models"``, ``"horovod"``,
            ``"tensorflow"``); its supported releases become the patch's ``versions``.
    """
    checked = _CHECKED_AS.get(library, library)
    if checked not in SUPPORTED:
        raise ValueError(f"no supported versions known for {library!r}. Received: {target}")
    versions = tuple(f"{library} {p}" for p in SUPPORTED[checked])
    patch = Patch(target, change, why, versions, scope, when if scope == PROCESS else ON_USE)
    known = _declared.setdefault(target, patch)
    if known != patch:
        raise ValueError(f"patch {target} is declared twice, differently")
    return known


def replace(patch: Patch, owner, wrap, *, again: bool = False) -> None:
    """Sets ``owner.<attribute>`` to ``wrap(original)`` (``original`` None where ``owner`` has
    none) for the declared ``patch``. A process-wide patch goes in once: a second call finds
    its replacement in place and leaves it (idempotent), unless ``again`` (a replacement
    that ignores the original and takes new values, such as an address).

    Raises:
        ValueError: ``patch`` was not declared, or ``owner`` is not its target.
    """
    if _declared.get(patch.target) is not patch:
        raise ValueError(f"undeclared patch; declare it first. Received: {patch.target}")
    name = patch.attribute
    if patch.scope == PROCESS:
        where = getattr(owner, "__qualname__", None) or ""
        module = owner.__name__ if inspect.ismodule(owner) else owner.__module__
        found = ".".join(p for p in (module, where, name) if p)
        if found != patch.target:
            raise ValueError(f"patch {patch.target} made on another owner. Received: {found}")
        in_place = inspect.getattr_static(owner, name, None)
        if not again and in_place is _installed.get(patch.target, _NONE):
            return
    if patch.when != AT_IMPORT:  # what goes in at import serves the block: it checks itself
        ensure_supported()
    replacement = wrap(getattr(owner, name, None))
    setattr(owner, name, replacement)
    if patch.scope == PROCESS:
        _installed[patch.target] = inspect.getattr_static(owner, name)


def declared() -> list:
    """Every declared :class:`Patch`, by target (import the compat modules first:
    :func:`merlin_models_de.compat.patches`)."""
    return sorted(_declared.values(), key=lambda p: p.target)


def installed() -> list:
    """Targets of the process-wide patches in place in this process, sorted."""
    return sorted(_installed)


def markdown() -> str:
    """The declared patches as docs/training.md lists them: one item each."""
    lines = []
    for patch in declared():
        lines.append(
            f"- `{patch.target}` ({patch.scope}, {patch.when}; checked for "
            f"{', '.join(patch.versions)}): {patch.change} Why: {patch.why}"
        )
    return "\n".join(lines) + "\n"
