"""The name a command's usage and error lines show: the one the user typed.

Installed, a command runs as its console script (``mmde-dlrm``), and ``sys.argv[0]`` is that
script's path; started as ``python -m merlin_models_de.apps.dlrm``, ``sys.argv[0]`` is the
module's ``__main__.py``, which nobody types. So a console script of this package names
itself, and anything else names the module form.

Example:
    >>> program_name("merlin_models_de.apps.tools.plan", ["/usr/bin/mmde-plan"])  # doctest: +SKIP
    'mmde-plan'
    >>> program_name("merlin_models_de.apps.tools.plan", ["plan.py"])
    'python -m merlin_models_de.apps.tools.plan'
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

PACKAGE = "merlin_models_de"


def console_scripts() -> set[str]:
    """The console scripts the installed package declares (none when run from a source
    tree that was never installed)."""
    return {
        ep.name
        for ep in metadata.entry_points(group="console_scripts")
        if ep.value.startswith(f"{PACKAGE}.")
    }


def program_name(module: str, argv: list[str] | None = None) -> str:
    """The command as the user started it: the console script's name when ``argv[0]``
    (default ``sys.argv``) is one of this package's, else ``python -m <module>``."""
    argv = sys.argv if argv is None else argv
    typed = os.path.basename(argv[0]) if argv and argv[0] else ""
    if typed and typed in console_scripts():
        return typed
    return f"python -m {module}"


__all__ = ["program_name", "console_scripts"]
