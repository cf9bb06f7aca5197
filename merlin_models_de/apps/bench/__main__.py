"""``python -m merlin_models_de.apps.bench``: the DLRM bench (:mod:`.dlrm`)."""

import sys

from merlin_models_de.apps.bench.dlrm import main

if __name__ == "__main__":
    sys.exit(main())
