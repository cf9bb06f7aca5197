"""Alias of :mod:`merlin_models_de.apps.dlrm`, kept for ``python -m merlin_models_de.dlrm``."""
import sys

from merlin_models_de.apps.dlrm import main

if __name__ == "__main__":
    sys.exit(main())
