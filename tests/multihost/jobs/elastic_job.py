"""Elastic job (horovodrun --min-np 1 --max-np 2 --host-discovery-script ...): the fit oracle's
DLRM trained on a fixed global batch of G rows split over the ranks there are, with Keras fit
(LOOP "fit") or a custom loop of gradient tapes (LOOP "custom"), a commit (sharded checkpoint)
every 2 steps. On 2 ranks, with HOW "kill" the rank on h2 writes OUT/ready as it begins
step 6 and then waits: the test kills its host; with HOW "drop" both ranks write OUT/ready
as step 5 begins and wait (checking for host updates) while the test drops h2 from the
host list: h2 leaves alive, at a reset that skips the sync. Alone, the rank on h1 writes OUT/alone as it begins step 9
and waits (checking for host updates) until h2 is back: the reset takes it in. The process
on h1 writes OUT/elastic.npz at the end: the loss (the mean over the ranks) and world size of
each step, the checkpoint each start restored, the final weights.

Usage: python -m tests.multihost.jobs.elastic_job DATA.npz OUT_DIR [LOOP [HOW]]
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

from tests.multihost.jobs import watchdog

G, STEPS, LR, EVERY = 32, 12, 0.05, 2
KILLED_AT, DROPPED_AT, REJOINED_AT = 5, 4, 8  # state.step as the step that waits begins
HOSTS_WAIT = 120  # seconds the ranks wait for a change of hosts


def build_for(n, x, loop="fit"):
    from tests.ranks import oracle_dlrm as fc

    spec = dict(
        optimizer="adagrad", strategy="memory_balanced", column=4000, world_size=n, per_rank=G // n
    )
    model = fc.build_model(spec)
    model(fc.take(x, 0, 2))
    if loop == "fit":
        # Merlin multiplies the learning rate by the world size: the global batch is fixed here
        model.compile(optimizer=fc.optimizer("adagrad", LR / n))
    else:  # a custom loop's optimizer, as given (the commits keep model.optimizer's slots)
        model.optimizer = fc.optimizer("adagrad", LR)
    return model


def custom_step(model, batch, labels) -> float:
    """One step of a custom loop: this rank's mean binary cross-entropy, its gradients through
    the block's distributed tape (dense ones averaged, the shards' scaled), one update."""
    from merlin_models_de.merlin.training import DistributedGradientTape

    with tf.GradientTape() as tape:
        out = model(batch, training=True)  # Merlin: a PredictionOutput when training
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, out.predictions))
    variables = model.trainable_variables
    grads = DistributedGradientTape(tape, model).gradient(loss, variables)
    model.optimizer.apply_gradients(zip(grads, variables))
    return float(loss)


HOST = os.environ.get("HOROVOD_HOSTNAME")


def main(src, out, loop="fit", how="kill"):
    watchdog.start()
    from merlin_models_de import comm
    from merlin_models_de.elastic.state import ShardedState, run
    from merlin_models_de.persistence.checkpoint import latest_checkpoint
    from tests.ranks import oracle_dlrm as fc

    data = dict(np.load(src, allow_pickle=True))
    data.pop("spec", None)
    x, y = fc.split_xy(data, {})
    state = ShardedState(
        lambda: build_for(comm.size(), x, loop), os.path.join(out, "ckpt"), commit_every=EVERY
    )
    record = {"loss": {}, "world": {}, "starts": []}

    def step_begins():
        watchdog.progress()
        # the rank on h2, whichever rank Horovod's elastic driver gave it
        if comm.size() == 2 and how == "kill" and HOST == "h2" and state.step == KILLED_AT:
            open(os.path.join(out, "ready"), "w").close()
            while True:  # the test kills this host now
                time.sleep(1)
                watchdog.progress()
        if comm.size() == 2 and how == "drop" and state.step == DROPPED_AT:
            open(os.path.join(out, "ready"), "w").close()
            wait_for_new_hosts("h2 was not dropped")  # the test drops h2 from the list now
        if comm.size() == 1 and state.step == REJOINED_AT:
            open(os.path.join(out, "alone"), "w").close()
            wait_for_new_hosts("h2 was not taken back")  # the test brings h2 back now

    def wait_for_new_hosts(otherwise):
        waited = time.monotonic()
        while time.monotonic() - waited < HOSTS_WAIT:
            state.check_host_updates()  # raises HostsUpdatedInterrupt (on every rank)
            time.sleep(0.2)
            watchdog.progress()
        raise RuntimeError(f"{otherwise} within {HOSTS_WAIT} s")

    def step_ended(loss):
        record["loss"][state.step + 1] = float(np.mean(comm.allgather_object(loss)))
        record["world"][state.step + 1] = comm.size()

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            step_begins()

        def on_train_batch_end(self, batch, logs=None):
            step_ended(float(logs["loss_batch"]))

    @run
    def train(state):
        n, r = comm.size(), comm.rank()
        record["starts"].append(
            (state.step, n, os.path.basename(latest_checkpoint(state.directory) or ""))
        )
        if loop == "fit":
            rows = fc.rank_rows((STEPS - state.step) * G, G // n, n, r) + state.step * G
            state.model.fit(
                {k: v[rows] for k, v in x.items()},
                y[rows],
                batch_size=G // n,
                epochs=1,
                shuffle=False,
                verbose=0,
                callbacks=[Record(), state.callback()],
            )
            return
        while state.step < STEPS:
            step_begins()
            rows = fc.rank_rows(G, G // n, n, r) + state.step * G
            step_ended(
                custom_step(
                    state.model,
                    {k: tf.constant(v[rows]) for k, v in x.items()},
                    tf.constant(y[rows]),
                )
            )
            state.after_step()

    train(state)
    final = fc.snapshot(state.model)
    if HOST == "h1":  # the process that saw every step (its rank may change at a reset)
        steps = sorted(record["loss"])
        np.savez(
            os.path.join(out, "elastic.npz"),
            steps=np.array(steps),
            losses=np.array([record["loss"][s] for s in steps]),
            worlds=np.array([record["world"][s] for s in steps]),
            starts=json.dumps(record["starts"]),
            commits=json.dumps(state.commits),
            **final,
        )


if __name__ == "__main__":
    main(*sys.argv[1:5])
