#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Keras parity harness: trains an mpx config and its tf-keras 2.x twin side by side.

For each policy it builds the twin (bench/keras_twin.py), makes the initial
weights in Keras, writes them as a keras-layout safetensors file, trains mpx
(`weights.init_from`) and Keras for N steps on the same batches (no shuffle,
no augmentation, dropout off, constant learning rate) and compares, step by
step, the loss, the loss scale and the skipped steps, then every weight and
batch-norm statistic after the last step. docs/keras-parity.md explains the
method, the defaults that must agree and the measured differences.

    bench/keras_setup.sh                      # once: the venv with tensorflow-cpu and tf-keras
    ~/.cache/mpx-peers/keras/bin/python bench/keras_parity.py --config configs/mnist_smoke.yaml \\
        --data ../shared/data/mnist --steps 30 --batch 32

Loss-scale checks (mixed_float16): `--scale-initial 1e9` forces overflows at the
start, `--inject-inf K` makes step K (1-based) non-finite on both sides
(MPX_DEBUG_INJECT_INF in mpx), `--growth-interval G` shortens the growth period.
`--fixture DIR` also writes what tests/test_keras_parity.cpp replays without
TensorFlow. Exit 0 when every policy meets its target.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import yaml  # noqa: E402

import keras_reset as kr  # noqa: E402
import keras_twin as kt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"float32": 1e-4, "mixed_float16": 1e-3, "mixed_bfloat16": 2e-2}


def derived_config(cfg, a, policy, data, init, limit):
    """The config both sides train: the same net, fixed batches, constant learning rate."""
    c = json.loads(json.dumps(cfg))
    c.update(policy=policy, device="cpu", seed=int(cfg.get("seed", 42)))
    d = c["data"]
    d.update(path=os.path.abspath(data), batch_size=a.batch, shuffle=False, train_limit=limit, test_limit=a.batch,
             drop_last=True)
    d.pop("augment", None)
    c["schedule"] = {"name": "constant"}
    c["train"] = {"epochs": 1, "max_steps": a.steps, "log_every": 1, "eval_every": 1, "checkpoint_every": 1}
    c["weights"] = {"init_from": os.path.abspath(init)}
    ls = dict(c.get("loss_scale") or {})
    if policy == "mixed_float16":
        ls.setdefault("mode", "dynamic")
        if a.scale_initial:
            ls["initial"] = a.scale_initial
        if a.growth_interval:
            ls["growth_interval"] = a.growth_interval
        ls["max_consecutive_skips"] = 1000000
    else:
        ls = {"mode": "none"}
    c["loss_scale"] = ls

    def no_dropout(layers):
        for l in layers:
            if l["type"] == "dropout":
                l["rate"] = 0.0
            no_dropout(l.get("layers", []))
    no_dropout(c["model"]["layers"])
    return c


def run_mpx(a, cfg_path, run_dir, inject):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if inject:
        env["MPX_DEBUG_INJECT_INF"] = f"0:{inject - 1}"  # mpx counts global steps from 0
    r = subprocess.run([a.mpx, "train", "--config", cfg_path, "--run-dir", run_dir, "--no-progress", "-q"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mpx train failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    steps = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "step":
                steps.append((rec["loss"], rec["loss_scale"], rec["skipped_steps"]))
    final = os.path.join(run_dir, "final.safetensors")
    r = subprocess.run([a.mpx, "export", "--config", cfg_path, "--checkpoint", run_dir, "--out", final, "-q"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mpx export failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    from safetensors.numpy import load_file
    return steps, load_file(final)


def keras_optimizer(keras, cfg, policy, ls):
    o = cfg.get("optimizer") or {}
    name, lr = o.get("name", "adam"), float(o.get("learning_rate", 1e-3))
    if name == "sgd":
        opt = keras.optimizers.SGD(lr, momentum=float(o.get("momentum", 0.0)), nesterov=bool(o.get("nesterov", False)))
    elif name in ("adam", "adamw"):
        kw = dict(beta_1=float(o.get("beta1", 0.9)), beta_2=float(o.get("beta2", 0.999)),
                  epsilon=float(o.get("epsilon", 1e-7)))
        opt = keras.optimizers.AdamW(lr, weight_decay=float(o.get("weight_decay", 0.0)), **kw) \
            if name == "adamw" else keras.optimizers.Adam(lr, **kw)
    else:
        raise SystemExit(f"optimizer {name} has no Keras twin here")
    if policy == "mixed_float16" and ls.get("mode", "dynamic") != "none":
        if float(ls.get("growth_factor", 2.0)) != 2.0 or float(ls.get("backoff_factor", 0.5)) != 0.5:
            raise SystemExit("Keras 2's LossScaleOptimizer grows by 2 and backs off by 1/2 only")
        dyn = ls.get("mode", "dynamic") == "dynamic"
        kw = dict(initial_scale=float(ls.get("initial", 2 ** 15)))
        if dyn:
            kw["dynamic_growth_steps"] = int(ls.get("growth_interval", 2000))
        opt = keras.mixed_precision.LossScaleOptimizer(opt, dynamic=dyn, **kw)
    coupled_wd = float(o.get("weight_decay", 0.0)) if name != "adamw" else 0.0
    return opt, coupled_wd


def run_keras(a, cfg, policy, x, y, init_path, perturb=0.0, snapshots=None):
    """Trains the twin; returns per-step (loss, scale, skipped) and the final weights. With
    `perturb`, the initial weights are multiplied by (1 + perturb * N(0,1)) after init_path is
    written: a second Keras run of the same float32 net, rounding-sized apart (the noise floor).
    With a list `snapshots`, Keras' whole state before every step and after the last is appended
    to it (bench/keras_reset.py)."""
    import tensorflow as tf
    import tf_keras as keras
    from safetensors.numpy import save_file
    keras.backend.clear_session()
    keras.utils.set_random_seed(int(cfg.get("seed", 42)))  # python, numpy and TensorFlow: the same init each run
    keras.mixed_precision.set_global_policy(policy)
    model = kt.build_model(keras, cfg, policy, x.shape[1:])
    given = os.path.join(a.init_dir, os.path.basename(init_path)) if a.init_dir else ""
    if given and os.path.exists(given) and not perturb:  # --init-dir: these initial weights, not Keras' fresh ones
        import shutil
        if os.path.abspath(given) != os.path.abspath(init_path):
            shutil.copy(given, init_path)
    if perturb or (given and os.path.exists(given)):
        # The first run's initial weights (--init-dir's), with --noise-floor each times (1 + perturb * N(0, 1))
        from safetensors.numpy import load_file
        init, rng = load_file(init_path), np.random.RandomState(1)
        for layer in model.layers:
            for v in layer.weights:
                w = init[f"{layer.name}/{v.name.split('/')[-1].split(':')[0]}"]
                v.assign((w * (1.0 + perturb * rng.standard_normal(w.shape))).astype(np.float32))
    else:
        save_file(kt.keras_weights(model), init_path, metadata={"layout": "keras"})
    opt, wd = keras_optimizer(keras, cfg, policy, cfg["loss_scale"])
    lso = isinstance(opt, keras.mixed_precision.LossScaleOptimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tv = model.trainable_variables

    @tf.function
    def step(xb, yb, bump):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(xb, training=True), tf.float32)
            loss = loss_fn(yb, logits)
            scaled = opt.get_scaled_loss(loss) if lso else loss
        grads = tape.gradient(scaled, tv)
        if lso:
            grads = opt.get_unscaled_gradients(grads)
        grads = [g + wd * v for g, v in zip(grads, tv)] if wd else list(grads)
        grads[0] = grads[0] + bump  # +inf on the step given by --inject-inf (as MPX_DEBUG_INJECT_INF does)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])  # what LSO tests
        opt.apply_gradients(zip(grads, tv))
        return loss, finite

    out, skipped, consecutive = [], 0, 0
    xs = kt.normalize(x, cfg)
    for k in range(a.steps):
        if snapshots is not None:
            snapshots.append(kr.keras_snapshot(model, opt, lso, skipped, consecutive))
        sl = slice(k * a.batch, (k + 1) * a.batch)
        bump = tf.constant(np.inf if k + 1 == a.inject_inf else 0.0, tv[0].dtype)
        loss, finite = step(tf.constant(xs[sl]), tf.constant(y[sl]), bump)
        good = bool(finite) or not lso
        skipped += 0 if good else 1
        consecutive = 0 if good else consecutive + 1
        out.append((float(loss), float(opt.loss_scale.numpy()) if lso else 1.0, skipped))
    if snapshots is not None:
        snapshots.append(kr.keras_snapshot(model, opt, lso, skipped, consecutive))
    return out, kt.keras_weights(model)


def compare(policy, mpx_steps, keras_steps, mpx_w, keras_w):
    """Largest relative loss difference, whether scale/skip trajectories are identical, and the
    worst tensor (max |difference| over max |Keras value|, per tensor)."""
    n = min(len(mpx_steps), len(keras_steps))
    loss_rel = [abs(m[0] - k[0]) / max(abs(k[0]), 1e-30) for m, k in zip(mpx_steps, keras_steps)]
    same_scale = [m[1] == k[1] and m[2] == k[2] for m, k in zip(mpx_steps, keras_steps)]
    worst_w = ("", 0.0)
    missing = sorted(set(keras_w) ^ set(mpx_w))
    for name in sorted(set(keras_w) & set(mpx_w)):
        kv, mv = keras_w[name].astype(np.float64), mpx_w[name].astype(np.float64)
        if kv.shape != mv.shape:
            missing.append(f"{name} (shape {mv.shape} vs {kv.shape})")
            continue
        rel = float(np.abs(kv - mv).max() / max(np.abs(kv).max(), 1e-30))
        if rel >= worst_w[1]:
            worst_w = (name, rel)
    return {"policy": policy, "steps": n, "steps_mpx": len(mpx_steps), "steps_keras": len(keras_steps),
            "max_loss_rel": max(loss_rel) if loss_rel else float("nan"),
            "max_loss_rel_step": int(np.argmax(loss_rel)) + 1 if loss_rel else 0,
            "scale_trajectory_identical": all(same_scale) and len(mpx_steps) == len(keras_steps),
            "first_scale_mismatch": next((i + 1 for i, s in enumerate(same_scale) if not s), None),
            "worst_weight": worst_w[0], "worst_weight_rel": worst_w[1], "unmatched_tensors": missing,
            "mpx": mpx_steps, "keras": keras_steps}


def write_fixture(dirname, policy, cfg_path, init, res, a, keras_w):
    """What tests/test_cli_keras_parity.cpp replays without TensorFlow: the config, the Keras
    initial weights, Keras' per-step loss, scale and skipped count, and its batch-norm moving
    statistics after the last step."""
    os.makedirs(dirname, exist_ok=True)
    name = a.fixture_name or policy
    import shutil
    with open(cfg_path) as f:
        c = yaml.safe_load(f)
    c["data"]["path"] = "data"  # the test passes the fixture's data folder
    c["weights"]["init_from"] = f"{name}.init.safetensors"
    with open(os.path.join(dirname, f"{name}.yaml"), "w") as f:
        f.write("# Written by bench/keras_parity.py --fixture (docs/keras-parity.md); do not edit.\n")
        yaml.safe_dump(c, f, sort_keys=False)
    shutil.copy(init, os.path.join(dirname, f"{name}.init.safetensors"))
    exp = {"policy": policy, "tolerance": TARGETS[policy], "inject_inf_step": a.inject_inf or 0,
           "command": "bench/keras_parity_fixtures.sh", "tensorflow": _versions(),
           "keras": [{"loss": l, "loss_scale": s, "skipped_steps": k} for l, s, k in res["keras"]],
           "measured_max_loss_rel": res["max_loss_rel"],
           "keras_final_bn": {n: [float(v) for v in w.ravel()] for n, w in sorted(keras_w.items())
                              if n.endswith(("/moving_mean", "/moving_variance"))}}
    with open(os.path.join(dirname, f"{name}.expected.json"), "w") as f:
        json.dump(exp, f, indent=1)
        f.write("\n")


def _versions():
    import tensorflow as tf
    import tf_keras
    return f"tensorflow {tf.__version__}, tf-keras {tf_keras.__version__}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", help="data folder (default: the config's data.path)")
    ap.add_argument("--policies", default="float32,mixed_float16,mixed_bfloat16")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="threads for TensorFlow and for mpx (OMP_NUM_THREADS)")
    ap.add_argument("--scale-initial", type=float, default=None, help="mixed_float16: initial loss scale")
    ap.add_argument("--growth-interval", type=int, default=None, help="mixed_float16: growth interval")
    ap.add_argument("--inject-inf", type=int, default=0, help="make step K (1-based) non-finite on both sides")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key for both sides, e.g. optimizer.learning_rate=0.01 (repeatable)")
    ap.add_argument("--mpx", default=os.path.join(ROOT, "build", "app", "mpx"))
    ap.add_argument("--fixture", help="also write the replay fixture for tests/ into this folder")
    ap.add_argument("--noise-floor", type=float, default=0.0, metavar="EPS",
                    help="also train Keras a second time from weights perturbed by EPS (relative, e.g. 1e-7) "
                         "and print how far its loss drifts from the first run's: the net's own sensitivity")
    ap.add_argument("--reset-each-step", action="store_true",
                    help="also compare one step at a time: mpx starts every step from Keras' state after the "
                         "previous one (weights, statistics, optimizer, loss scale); prints the largest one-step "
                         "loss and update differences")
    ap.add_argument("--reset-floor", action="store_true",
                    help="with --reset-each-step: also take every step with mpx's plain loops "
                         "(MPX_CPU_REFERENCE=1) and print how far mpx lies from itself (the float32 floor)")
    ap.add_argument("--init-dir", help="start from DIR/<fixture name or policy>.init.safetensors where it "
                                       "exists instead of fresh Keras weights (regenerating fixtures)")
    ap.add_argument("--fixture-name", help="file names of the fixture (default: the policy)")
    ap.add_argument("--json", help="write the full comparison (every step) to this file")
    ap.add_argument("--keep", help="keep the work files (configs, weights, runs) in this folder")
    a = ap.parse_args()

    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    cfg = kt.load_config(a.config)
    for kv in a.set:
        key, _, value = kv.partition("=")
        node, parts = cfg, key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(value)
    data = a.data or cfg["data"].get("path") or f"data/{cfg['data']['dataset']}"
    limit = a.steps * a.batch
    x, y = kt.read_train(cfg["data"]["dataset"], data, limit)
    if len(y) < limit:
        raise SystemExit(f"{data}: {len(y)} training records, {limit} needed for {a.steps} steps of {a.batch}")
    results, ok = [], True
    work = a.keep or tempfile.mkdtemp(prefix="keras-parity-")
    os.makedirs(work, exist_ok=True)
    for policy in a.policies.split(","):
        init = os.path.join(work, f"{a.fixture_name or policy}.init.safetensors")
        c = derived_config(cfg, a, policy, data, init, limit)
        cfg_path = os.path.join(work, f"{policy}.yaml")
        with open(cfg_path, "w") as f:
            yaml.safe_dump(c, f, sort_keys=False)
        snaps = [] if a.reset_each_step else None
        keras_steps, keras_w = run_keras(a, c, policy, x, y, init, snapshots=snaps)
        if a.keep:
            from safetensors.numpy import save_file
            save_file(keras_w, os.path.join(work, f"{policy}.keras_final.safetensors"))
        mpx_steps, mpx_w = run_mpx(a, cfg_path, os.path.join(work, f"run-{policy}"), a.inject_inf)
        res = compare(policy, mpx_steps, keras_steps, mpx_w, keras_w)
        floor = ""
        if a.noise_floor:
            tf.random.set_seed(int(c.get("seed", 42)))
            k2, _ = run_keras(a, c, policy, x, y, init, perturb=a.noise_floor)
            res["noise_floor_steps"] = [abs(p[0] - q[0]) / abs(q[0]) for p, q in zip(k2, keras_steps)]
            res["noise_floor"] = max(res["noise_floor_steps"])
            floor = f"; Keras vs Keras from weights {a.noise_floor:g} apart: {res['noise_floor']:.3e}"
        good = res["max_loss_rel"] <= TARGETS[policy] and res["scale_trajectory_identical"] \
            and not res["unmatched_tensors"]
        ok &= good
        print(f"{cfg.get('name', a.config)} [{policy}] {res['steps']} steps of {a.batch}: max rel loss diff "
              f"{res['max_loss_rel']:.3e} (step {res['max_loss_rel_step']}, target {TARGETS[policy]:g}); "
              f"scale/skips {'identical' if res['scale_trajectory_identical'] else 'DIFFER at step %s' % res['first_scale_mismatch']}"
              f" (final scale {mpx_steps[-1][1]:g}, skipped {mpx_steps[-1][2]}); worst weight {res['worst_weight']} "
              f"{res['worst_weight_rel']:.3e}{floor}{'' if good else '  <-- FAIL'}", flush=True)
        if a.reset_each_step:
            env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
            per = kr.run_reset(a, c, policy, cfg_path, work, x, y, snaps, [s[0] for s in keras_steps], data, env)
            r1 = kr.summarize(per)
            res["reset"] = {"summary": r1, "steps": per}
            rgood = r1["loss_rel"] <= TARGETS[policy] and r1["update_rel"] <= TARGETS[policy] and r1["scale_same"]
            ok &= rgood
            print(f"  reset each step [{policy}]: max one-step rel loss diff {r1['loss_rel']:.3e} (step "
                  f"{r1['loss_step']}); max rel update diff {r1['update_rel']:.3e} ({r1['update_tensor']}, step "
                  f"{r1['update_step']}; 2-norm {r1['update_rel2']:.3e}, {r1['update2_tensor']}); max rel weight diff after the step {r1['after_rel']:.3e} "
                  f"({r1['after_tensor']}); scale/skips {'identical' if r1['scale_same'] else 'DIFFER'}"
                  f"{'' if rgood else '  <-- beyond target'}", flush=True)
            if a.reset_floor:
                print(f"  mpx oneDNN vs mpx plain loops, same steps: max one-step rel loss diff "
                      f"{r1['floor_loss_rel']:.3e}; max rel update diff {r1['floor_update_rel']:.3e} "
                      f"(2-norm {r1['floor_update_rel2']:.3e})", flush=True)
        if res["unmatched_tensors"]:
            print("  unmatched tensors:", ", ".join(res["unmatched_tensors"]))
        if a.fixture:
            write_fixture(a.fixture, policy, cfg_path, init, res, a, keras_w)
        results.append(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if not a.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
