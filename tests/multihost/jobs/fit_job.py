"""Multi-host fit job: the fit oracle's DLRM (tests/ranks/oracle_dlrm) trained from the
reference's initial weights on this rank's rows; rank 0 writes the final full weights, the
mean per-step losses and each rank's host, and every rank writes a sharded checkpoint.

Usage (under horovodrun): python -m tests.multihost.jobs.fit_job IN.npz REF.npz OUT_DIR
With REF.npz = "-" it restores OUT_DIR/restore-from instead and writes what it restored.
"""

import json
import os
import sys

import numpy as np

from tests.multihost.jobs import watchdog


def main(src, ref_path, out):
    watchdog.start()
    from merlin_models_de import comm
    from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
    from tests.ranks import oracle_dlrm as fc

    data = dict(np.load(src, allow_pickle=True))
    spec = dict(json.loads(str(data.pop("spec"))), world_size=comm.size())
    n, r = comm.size(), comm.rank()
    x, y = fc.split_xy(data, spec)
    rows = fc.rank_rows(len(y), spec["per_rank"], n, r)
    x_mine, y_mine = {k: v[rows] for k, v in x.items()}, y[rows]
    model = fc.build_model(spec)
    model(fc.take(x_mine, 0, 2))
    model.compile(optimizer=fc.optimizer(spec["optimizer"], spec["lr"]))
    hosts = comm.allgather_object(watchdog.host())
    if ref_path == "-":  # restore a checkpoint written elsewhere, report what it holds
        restore_checkpoint(model, os.path.join(out, "restore-from"))
        restored = fc.snapshot(model)
        if r == 0:
            np.savez(os.path.join(out, "restored.npz"), hosts=np.array(hosts), **restored)
        return
    fc.restore(model, dict(np.load(ref_path, allow_pickle=True)), "initial")

    class Beat(fc.LossRecorder):
        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            watchdog.progress()

    losses = Beat()
    model.fit(
        x_mine,
        y_mine,
        batch_size=spec["per_rank"],
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[losses],
    )
    final = fc.snapshot(model)
    per_step = np.mean(comm.allgather_object(losses.losses), axis=0)
    save_checkpoint(model, os.path.join(out, "ckpt"))
    if r == 0:
        np.savez(os.path.join(out, "final.npz"), losses=per_step, hosts=np.array(hosts), **final)


if __name__ == "__main__":
    main(*sys.argv[1:4])
