"""The single-process side of the checkpoint tests (run as a subprocess without Horovod).

Usage: python -m tests.ranks.checkpoint_reference SPEC_JSON DATA.npz RESTORE_DIR|- SAVE_DIR
Builds the test DLRM at world size 1, restores RESTORE_DIR if given (else trains 2 steps),
trains one more step when restoring, and saves a checkpoint to SAVE_DIR.
"""

import json
import sys

import numpy as np


def main(spec_json, data_path, restore_dir, save_dir):
    from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
    from tests.ranks import oracle_dlrm as fc

    spec = json.loads(spec_json)
    x, y = fc.split_xy(dict(np.load(data_path)), spec)
    model = fc.build_model(spec)
    model(fc.take(x, 0, 2))
    model.compile(optimizer=fc.optimizer(spec["optimizer"], spec["lr"]))
    if restore_dir != "-":
        restore_checkpoint(model, restore_dir)
        save_checkpoint(model, save_dir)
        model.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
        assert np.isfinite(model.evaluate(x, y, batch_size=len(y), verbose=0)[0])
    else:
        model.fit(x, y, batch_size=len(y) // 2, epochs=1, shuffle=False, verbose=0)
        save_checkpoint(model, save_dir)


if __name__ == "__main__":
    main(*sys.argv[1:5])
