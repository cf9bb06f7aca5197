"""Alias of :mod:`merlin_models_de.apps.bench`, kept for ``python -m merlin_models_de.bench``."""
import sys

from merlin_models_de.apps.bench import main

if __name__ == "__main__":
    sys.exit(main())
