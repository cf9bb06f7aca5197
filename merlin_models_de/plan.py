"""Alias of :mod:`merlin_models_de.apps.plan`, kept for ``python -m merlin_models_de.plan``."""
import sys

from merlin_models_de.apps.plan import main

if __name__ == "__main__":
    sys.exit(main())
