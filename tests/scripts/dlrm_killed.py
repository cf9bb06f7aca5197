"""Job for the DLRM resume test: the DLRM command, killed with SIGKILL right after the
optimizer step given first (after that step's checkpoint, if one is due).

Usage: python tests/scripts/dlrm_killed.py STEP [DLRM options]
"""

import os
import signal
import sys
import time

STARTED = time.perf_counter()
# this checkout's package, whatever an installed copy says
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv):
    import tensorflow as tf

    from merlin_models_de.apps.dlrm import options as dlrm_options
    from merlin_models_de.apps.dlrm.run import run

    step = int(argv[0])

    class Die(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == step:
                os.kill(os.getpid(), signal.SIGKILL)

    args = dlrm_options.parser().parse_args(argv[1:])
    assert dlrm_options.check(args) is None, dlrm_options.check(args)
    run(args, STARTED, callbacks=[Die()])


if __name__ == "__main__":
    main(sys.argv[1:])
