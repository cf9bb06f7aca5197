"""The dynamic-table checkpoint tests' model, what they compare, and the one-process side
(run as ``python -m tests.ranks.dynamic_checkpoint IN.npz OUT.npz``, no Horovod): it restores
the 2 ranks' checkpoint into one process, saves it again from there, and trains on with the
global batch.

The model is ``dynamic_model``'s DLRM whose ``history`` table admits a key at its second
sighting (so the checkpoint holds candidates too); its capacity holds every key (no
eviction), so one process with batch N*B trains as N ranks with batch B.
"""

import json
import sys

import numpy as np

from tests.ranks import dynamic_model as dm

LR = 0.2  # Adagrad's, on one rank of N (one process with the global batch: N times it)
STEPS = 4  # the first half trains before the checkpoint, the second after


def options():
    from merlin_models_de import DynamicTable

    return {
        "item": DynamicTable(capacity=400),
        "history": DynamicTable(capacity=400, admit_after=2),
    }


def compiled(data, lr):
    import tensorflow as tf

    model = dm.build_model(options())
    x, _ = dm.inputs(data, np.arange(2))
    model(x)
    model.compile(optimizer=tf.keras.optimizers.legacy.Adagrad(lr))
    return model


def dynamic_state(model) -> dict:
    """Collective: the dynamic tables read back by key (rows and Adagrad's accumulators),
    their counters, steps, default rows and candidates (each ``[key, count, last step]``,
    sorted by key), the dense weights and the optimizer's iterations."""
    from merlin_models_de import comm
    from merlin_models_de.dynamic.contents import gathered, slot_arrays
    from merlin_models_de.variables import dense_weights, embedding_blocks, slots_of

    (block,) = embedding_blocks(model)
    out = {f"dense/{i}": w.numpy() for i, w in enumerate(dense_weights(model, [block]))}
    out["iterations"] = model.optimizer.iterations.numpy()
    counters = block.dynamic_counters()
    for table, keymap in sorted(block.backend.keymaps.items()):
        var = block.backend.rw[table]
        out[f"keys/{table}"], out[f"rows/{table}"] = gathered(keymap, var)
        for name, slot in slots_of(model.optimizer, var).items():
            out[f"slot/{table}/{name}"] = gathered(keymap, slot)[1]
        out[f"counters/{table}"] = np.array(list(counters[table].values()))
        out[f"step/{table}"] = keymap.step.numpy()
        out[f"default/{table}"] = block.backend.defaults[table].numpy()
        if keymap.candidates is not None:
            held = np.concatenate(comm.allgather_object(slot_arrays(keymap.candidates)))
            held = held[held[:, 1] > 0]
            out[f"candidates/{table}"] = held[np.argsort(held[:, 0])]
    return out


def second_half(data):
    """``(rows, per-step batch)`` of the steps after the checkpoint, for one process."""
    total = len(data["label"])
    return np.arange(total // 2, total), total // STEPS


def reference(src, dst):
    """Restores ``spec["saved"]`` into one process, saves it to ``spec["again"]``, trains the
    second half: the state after the restore, the per-step losses, the final state."""
    from merlin_models_de.persistence.checkpoint import restore_checkpoint, save_checkpoint
    from tests.ranks.oracle_dlrm import LossRecorder

    data = dict(np.load(src, allow_pickle=True))
    spec = json.loads(str(data.pop("spec")))
    model = compiled(data, LR * spec["world_size"])
    restored = restore_checkpoint(model, spec["saved"])
    out = {f"restored/{k}": v for k, v in dynamic_state(model).items()}
    out["rehomed"] = np.array(json.dumps(str(restored.get("rehomed"))))
    save_checkpoint(model, spec["again"])
    rows, batch = second_half(data)
    losses = LossRecorder()
    model.fit(dm.dataset(data, rows, batch), epochs=1, verbose=0, callbacks=[losses])
    out["losses"] = np.array(losses.losses)
    out.update({f"final/{k}": v for k, v in dynamic_state(model).items()})
    np.savez(dst, **out)


if __name__ == "__main__":
    reference(sys.argv[1], sys.argv[2])
