"""Peak memory of one vocab-parallel loss + gradient step, in a fresh process.

Usage: python -m tests.commands.vocab_parallel_memory CATALOG BATCH DIM CHUNK
Prints JSON: the process's peak RSS before and after the step (bytes; Linux ru_maxrss), and
what the full ``[batch, catalog]`` logits would take.
"""

import json
import resource
import sys


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(catalog, batch, dim, chunk):
    import numpy as np
    import tensorflow as tf

    from merlin_models_de.outputs.vocab_parallel import sharded_softmax_cross_entropy

    rng = np.random.default_rng(0)
    table = tf.Variable(rng.normal(size=(catalog, dim)).astype(np.float32))
    hidden = tf.constant(rng.normal(size=(batch, dim)).astype(np.float32))
    targets = tf.constant(rng.integers(0, catalog, batch))

    @tf.function
    def step(hidden):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_mean(
                sharded_softmax_cross_entropy(hidden, targets, table, 0, catalog, chunk_rows=chunk)
            )
        return loss, tape.gradient(loss, [hidden, table])

    step.get_concrete_function(hidden)  # trace and compile before measuring
    before = peak_rss()
    loss, grads = step(hidden)
    float(loss), [g.numpy() for g in grads]
    print(
        json.dumps(
            {
                "before": before,
                "after": peak_rss(),
                "full_logits": batch * catalog * 4,
                "table": catalog * dim * 4,
            }
        )
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
