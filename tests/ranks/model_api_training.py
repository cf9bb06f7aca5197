"""Training with Merlin's model-level API (freezing tables by name, an optimizer per block),
shared by the 2-rank test (test_model_api.py) and its one-process reference.

Usage (the reference, a plain subprocess): python -m tests.ranks.model_api_training IN OUT
"""

import json
import sys

import numpy as np
import tensorflow as tf

from tests.ranks import oracle_dlrm as fc


def optimizer_for(spec, model, lr):
    import merlin.models.tf as mm

    from merlin_models_de.variables import embedding_blocks

    if spec["optimizer"] != "multi":
        return fc.optimizer(spec["optimizer"], lr)
    block = embedding_blocks(model)[0]
    return mm.MultiOptimizer(
        default_optimizer=tf.keras.optimizers.legacy.Adagrad(lr),
        optimizers_and_blocks=[
            mm.OptimizerBlocks(mm.LazyAdam(lr), [block[t] for t in spec["lazy"]])
        ],
    )


def train(model, x, y, batch, spec, lr):
    """Freezes ``spec["freeze"]`` by name, trains an epoch, unfreezes them, trains another;
    returns the weights after each epoch (collective: full tables on every rank)."""
    out = {}
    if spec.get("freeze"):
        model.freeze_blocks(list(spec["freeze"]))  # (Merlin empties the list it is given)
    model.compile(optimizer=optimizer_for(spec, model, lr), run_eagerly=False)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    out.update({f"frozen/{k}": v for k, v in fc.snapshot(model).items()})
    if spec.get("freeze"):
        model.unfreeze_all_frozen_blocks()
        model.compile(optimizer=optimizer_for(spec, model, lr), run_eagerly=False)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    out.update({f"final/{k}": v for k, v in fc.snapshot(model).items()})
    return out


def main(src, dst):
    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    model = fc.build_model(dict(spec, backend="horovod"))
    x, y = fc.split_xy(data, spec)
    model(fc.take(x, 0, 2))
    out = {f"initial/{k}": v for k, v in fc.snapshot(model).items()}
    n = spec["world_size"]
    out.update(train(model, x, y, spec["per_rank"] * n, spec, spec["lr"] * n))
    np.savez(dst, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
