"""Single-process reference for the fit oracle test; run as a plain subprocess (no Horovod).

Usage: python -m tests.ranks.fit_reference IN.npz OUT.npz
Builds the same DLRM as the test at world size 1, records its initial weights, trains one
epoch on the global data with the global batch, and saves weights, per-step losses,
evaluate() results and predictions.
"""

import json
import sys

import numpy as np


def main(src, dst):
    import tensorflow as tf

    from tests.ranks import oracle_dlrm as fc

    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    if spec.get("model") == "session":
        from tests.ranks import session_model

        return session_model.reference(spec, data, dst)
    if spec.get("model") == "next_item":
        from tests.ranks import session_model

        return session_model.next_item_reference(spec, data, dst)
    model = fc.build_model(dict(spec, backend="horovod"))  # the oracle: no engine, one process
    x, y = fc.split_xy(data, spec)
    model(fc.take(x, 0, 2))
    initial = fc.snapshot(model)
    batch = spec["per_rank"] * spec["world_size"]
    before = model.predict(x, batch_size=batch, verbose=0)
    model.compile(
        optimizer=fc.optimizer(spec["optimizer"], spec["lr"] * spec["world_size"]),
        run_eagerly=False,
    )
    losses = fc.LossRecorder()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[losses])
    final = fc.snapshot(model)
    evaluation = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    predictions = model.predict(x, batch_size=batch, verbose=0)
    out = {f"initial/{k}": v for k, v in initial.items()}
    out.update({f"final/{k}": v for k, v in final.items()})
    np.savez(
        dst,
        losses=np.array(losses.losses),
        predictions=np.asarray(predictions),
        predictions_before=np.asarray(before),
        evaluation=json.dumps({k: float(v) for k, v in evaluation.items()}),
        **out,
    )
    del tf


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
