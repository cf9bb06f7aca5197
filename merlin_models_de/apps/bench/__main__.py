"""``python -m merlin_models_de.apps.bench``: the DLRM bench (:mod:`.dlrm`);
``python -m merlin_models_de.apps.bench arrivals ...``: ids that keep arriving (:mod:`.arrivals`)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["arrivals"]:
        from merlin_models_de.apps.bench.arrivals import main

        sys.exit(main(sys.argv[2:]))
    from merlin_models_de.apps.bench.dlrm import main

    sys.exit(main())
