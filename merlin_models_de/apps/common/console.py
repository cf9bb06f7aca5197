"""What the commands show on the console: no import noise from Merlin or TensorFlow.

Merlin warns on import that PyTorch and Triton are missing and, for every Dataset, that
NVTabular runs on the CPU; TensorFlow logs INFO lines (oneDNN, CPU features) from C++ and
a Python warning about a module Merlin imports under its old name. None of it is something
a user of these commands can act on, so the commands silence exactly these messages
(other warnings still show). Call :func:`quiet_imports` before Merlin or TensorFlow load.

Example:
    >>> from merlin_models_de.apps.common.console import quiet_imports
    >>> quiet_imports()
"""

from __future__ import annotations

import logging
import os
import warnings

# Start of each message Merlin warns with on import or per Dataset (UserWarning).
MERLIN_NOISE = (
    "PyTorch dtype mappings did not load",
    "Triton dtype mappings did not load",
    "Initializing an NVTabular Dataset in CPU mode",
)
# TensorFlow's Python logger line when Merlin imports tensorflow.python.training.tracking.
TF_MOVED_MODULE = "Please fix your imports"


class _DropMovedModule(logging.Filter):
    def filter(self, record):
        return TF_MOVED_MODULE not in record.getMessage()


def quiet_imports() -> None:
    """Silences Merlin's import warnings and TensorFlow's INFO logs for this process.

    Idempotent. ``TF_CPP_MIN_LOG_LEVEL`` is only defaulted (to 2: TensorFlow's C++ errors
    still show; its start-up INFO and WARNING lines about CPU features and unused GPUs do
    not), so a user's own setting wins.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for text in MERLIN_NOISE:
        warnings.filterwarnings("ignore", message=text, category=UserWarning)
    tf_logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _DropMovedModule) for f in tf_logger.filters):
        tf_logger.addFilter(_DropMovedModule())
