#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tf-keras peer of `mpx bench`: times training steps of an mpx config's Keras twin.

Builds the twin (bench/keras_twin.py) under the config's policy (or --policy),
compiles it with the config's optimizer and a from-logits cross-entropy, and
times model.fit on random, already normalized float32 images held in memory
(what a Keras user does with a numpy array). A step is the time from the end
of one batch to the end of the next, so the input pipeline's share is in it.
images/s is images / the summed step times (as `mpx bench` reports it);
--budget-s ends the timing early where a policy is very slow.
Threads: TensorFlow's intra-op pool gets --threads, its inter-op pool 1.

    ~/.cache/mpx-peers/keras/bin/python bench/keras_peer.py --config configs/mnist_smoke.yaml --json

Needs the venv of bench/keras_setup.sh. Not a dependency of mpx; the driver
bench/cpu_peers.py runs it (docs/cpu-performance.md, "Against the peers").
"""
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import keras_twin as kt  # noqa: E402
import peer_common as pc  # noqa: E402

def optimizer(keras, cfg):
    o = cfg.get("optimizer") or {}
    name, lr = o.get("name", "adam"), float(o.get("learning_rate", 1e-3))
    if name == "sgd":
        return keras.optimizers.SGD(lr, momentum=float(o.get("momentum", 0.0)), nesterov=bool(o.get("nesterov")))
    if name in ("adam", "adamw"):
        kw = dict(beta_1=float(o.get("beta1", 0.9)), beta_2=float(o.get("beta2", 0.999)),
                  epsilon=float(o.get("epsilon", 1e-7)))
        if name == "adamw":
            return keras.optimizers.AdamW(lr, weight_decay=float(o.get("weight_decay", 0.0)), **kw)
        return keras.optimizers.Adam(lr, **kw)
    raise SystemExit(f"optimizer {name} has no Keras twin here")


def run(a):
    import tensorflow as tf
    import tf_keras as keras

    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cfg = kt.load_config(a.config)
    policy = a.policy or cfg.get("policy", "float32")
    batch = a.batch or int(cfg["data"].get("batch_size", 32))
    keras.mixed_precision.set_global_policy(policy)  # compile() adds the loss-scale optimizer for mixed_float16
    tf.random.set_seed(int(cfg.get("seed", 42)))
    hwc = pc.input_shape(cfg)
    model = kt.build_model(keras, cfg, policy, hwc)
    model.compile(optimizer=optimizer(keras, cfg),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    n = batch * (a.warmup + a.steps)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n,) + hwc, dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)

    ends = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            ends.append(time.perf_counter())
            timed = len(ends) - a.warmup
            if a.budget_s and timed >= 2 and ends[-1] - ends[a.warmup - 1] > a.budget_s:
                self.model.stop_training = True  # fit() stops after this batch

    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[Timer()])
    ms = [(t1 - t0) * 1e3 for t0, t1 in zip(ends[a.warmup - 1:], ends[a.warmup:])]
    params = kt.keras_weights(model)
    return {"peer": "tf-keras", "version": f"tensorflow {tf.__version__}, tf-keras {keras.__version__}",
            "config": a.config, "policy": policy, "batch_size": batch, "threads": a.threads,
            **pc.step_figures(batch, ms),
            "param_count": int(sum(v.size for v in params.values())),
            "param_shapes": {k: list(v.shape) for k, v in params.items()}}


if __name__ == "__main__":
    pc.main(__doc__, run, min_warmup=1)  # the step time is measured from the end of the previous batch
