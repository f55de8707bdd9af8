# SPDX-License-Identifier: MIT
"""Per-step reset comparison for bench/keras_parity.py --reset-each-step (docs/keras-parity.md).

At step k both frameworks start from Keras' state after step k-1 (weights, batch-norm
moving statistics, optimizer slots and iteration count, loss scale and its counter) and
take one step on batch k; the one-step losses and the states after the step are compared.
Keras simply continues its own run. mpx is driven by a checkpoint written from Keras'
state: `mpx train --resume` of a one-batch epoch. The checkpoint format is the one of
lib/io/checkpoint.h; where each Keras tensor lies in mpx's arenas is learnt from mpx
itself, by exporting a checkpoint whose arenas hold their own indices.
"""
import copy
import json
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np

MAGIC = b"MPXCKPT\0"


# ---- the checkpoint file ---------------------------------------------------------------

def read_ckpt(path):
    """(header dict, {section name: float32 array}), every CRC checked."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != MAGIC:
        raise SystemExit(f"{path}: not an mpx checkpoint")
    (hlen,) = struct.unpack_from("<I", raw, 12)
    text = raw[16:16 + hlen]
    (crc,) = struct.unpack_from("<I", raw, 16 + hlen)
    if zlib.crc32(text) != crc:
        raise SystemExit(f"{path}: header CRC mismatch")
    head = json.loads(text)
    secs = {}
    for s in head["sections"]:
        a = np.frombuffer(raw, np.float32, s["count"], s["offset"]).copy()
        if zlib.crc32(a.tobytes()) != s["crc32"]:
            raise SystemExit(f"{path}: section {s['name']} CRC mismatch")
        secs[s["name"]] = a
    return head, secs


def write_ckpt(path, head, secs):
    """Writes `head` (without its "sections") and the arenas `secs` [(name, array)] as mpx does."""
    h = {k: v for k, v in head.items() if k != "sections"}
    arrays = [(n, np.ascontiguousarray(a, np.float32)) for n, a in secs]
    base, text = 0, b""
    for _ in range(4):  # the offsets depend on the header's own length
        off, lst = base, []
        for n, a in arrays:
            lst.append({"name": n, "offset": off, "count": int(a.size), "crc32": zlib.crc32(a.tobytes())})
            off += a.nbytes
        h["sections"] = lst
        text = json.dumps(h, separators=(",", ":")).encode()
        if base == 20 + len(text):
            break
        base = 20 + len(text)
    version = 1 if h.get("param_align", 1) == 1 else 2
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", version, len(text)) + text + struct.pack("<I", zlib.crc32(text)))
        for _, a in arrays:
            f.write(a.tobytes())


# ---- where each Keras tensor lies in mpx's arenas --------------------------------------

def arena_map(mpx, cfg_path, template, work, env):
    """{keras name: ("master" | "state", index array of the Keras tensor's shape)}: a checkpoint
    whose master arena holds i + 1 and state arena -(i + 1) at index i, exported by mpx."""
    from safetensors.numpy import load_file
    head, secs = read_ckpt(template)
    n, s = head["num_params"], head["num_state"]
    if max(n, s) >= 1 << 24:
        raise SystemExit("arena too long to number in float32")
    arenas = [("master", np.arange(1, n + 1, dtype=np.float32)), ("state", -np.arange(1, s + 1, dtype=np.float32))]
    arenas += [(k, np.zeros_like(v)) for k, v in secs.items() if k.startswith("opt")]
    idx_ckpt, out = os.path.join(work, "index.ckpt"), os.path.join(work, "index.safetensors")
    write_ckpt(idx_ckpt, head, arenas)
    r = subprocess.run([mpx, "export", "--config", cfg_path, "--checkpoint", idx_ckpt, "--out", out, "-q"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mpx export of the index checkpoint failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    m = {}
    for name, v in load_file(out).items():
        if (v > 0).all():
            m[name] = ("master", v.astype(np.int64) - 1)
        elif (v < 0).all():
            m[name] = ("state", -v.astype(np.int64) - 1)
        else:
            raise SystemExit(f"{name}: mixes arenas in the index export")
    return m


# ---- Keras' state ----------------------------------------------------------------------

def keras_snapshot(model, opt, lso, skipped, consecutive):
    """Everything mpx needs to take Keras' next step: weights and statistics (keras layout),
    the optimizer's slots per trainable tensor, its iterations, the loss scale and counter."""
    import tf_keras as keras
    names = {}
    for layer in model.layers:
        for v in layer.weights:
            names[id(v)] = f"{layer.name}/{v.name.split('/')[-1].split(':')[0]}"
    inner = opt.inner_optimizer if lso else opt
    adam = isinstance(inner, (keras.optimizers.Adam, keras.optimizers.AdamW))
    kinds = ["_momentums", "_velocities"] if adam else ["momentums"]
    slots = []
    for kind in kinds:
        lst = getattr(inner, kind, None) or []
        d = {}
        for v in model.trainable_variables:
            key = inner._var_key(v)
            has = lst and key in getattr(inner, "_index_dict", {})
            d[names[id(v)]] = lst[inner._index_dict[key]].numpy() if has else np.zeros(v.shape, np.float32)
        slots.append(d)
    weights = {names[id(v)]: v.numpy().astype(np.float32) for v in model.weights}
    dyn = lso and getattr(opt, "dynamic", False)
    return {"weights": weights, "slots": slots, "iterations": int(inner.iterations.numpy()),
            "scale": float(opt.loss_scale.numpy()) if lso else 1.0,
            "counter": int(opt.dynamic_counter.numpy()) if dyn else 0,
            "skipped": skipped, "consecutive": consecutive}


def checkpoint_from(snap, head, secs, amap, k):
    """The mpx checkpoint of Keras' state `snap` before global step k (1-based), positioned at the
    start of a one-batch epoch."""
    h = copy.deepcopy(head)
    h.update(epoch=0, step_in_epoch=0, global_step=k - 1, applied_updates=snap["iterations"],
             epoch_loss_sum=0.0, epoch_correct=0, epoch_count=0, epoch_skipped=0)
    h["scaler"].update(scale=snap["scale"], good_steps=snap["counter"], skipped_total=snap["skipped"],
                       consecutive_skips=snap["consecutive"], last_skip_reason="")
    out = {"master": np.zeros_like(secs["master"]), "state": np.zeros_like(secs["state"])}
    for name, (arena, idx) in amap.items():
        out[arena][idx] = snap["weights"][name]
    opt_names = sorted(k2 for k2 in secs if k2.startswith("opt"))
    arenas = [("master", out["master"]), ("state", out["state"])]
    for j, on in enumerate(opt_names):
        a = np.zeros_like(secs[on])
        if a.size:
            for name, (arena, idx) in amap.items():
                if arena == "master" and name in snap["slots"][j]:
                    a[idx] = snap["slots"][j][name]
        arenas.append((on, a))
    return h, arenas


def mpx_state(amap, secs):
    """The keras-layout tensors of an mpx checkpoint's arenas."""
    return {name: secs[arena][idx] for name, (arena, idx) in amap.items()}


# ---- one batch per epoch ---------------------------------------------------------------

def one_batch_data(dataset, src, dst, x, y):
    """A data folder whose training set is the records x, y (uint8 NHWC) and whose test set is
    the source's (linked)."""
    os.makedirs(dst, exist_ok=True)
    if dataset in ("mnist", "fashion_mnist"):
        n, r, c = x.shape[0], x.shape[1], x.shape[2]
        with open(os.path.join(dst, "train-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, r, c) + x.astype(np.uint8).tobytes())
        with open(os.path.join(dst, "train-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + y.astype(np.uint8).tobytes())
        tests = [f for f in os.listdir(src) if f.startswith("t10k-")]
    else:
        rec = np.concatenate([y.astype(np.uint8)[:, None], x.transpose(0, 3, 1, 2).reshape(len(y), -1)], axis=1)
        rec.astype(np.uint8).tofile(os.path.join(dst, "data_batch_1.bin"))
        base = src if os.path.exists(os.path.join(src, "test_batch.bin")) else os.path.join(src, "cifar-10-batches-bin")
        src, tests = base, ["test_batch.bin"]
    for t in tests:
        link = os.path.join(dst, t)
        if not os.path.exists(link):
            os.symlink(os.path.abspath(os.path.join(src, t)), link)


# ---- the comparison --------------------------------------------------------------------

def rel(a, b):
    """max |a - b| / max |b| (max |a| when b is all zero)."""
    d = float(np.abs(a.astype(np.float64) - b).max()) if a.size else 0.0
    s = float(np.abs(b).max()) if b.size else 0.0
    return d / s if s > 0 else d


def rel2(a, b):
    """||a - b||_2 / ||b||_2 (||a||_2 when b is all zero)."""
    d = float(np.linalg.norm((a - b).ravel()))
    s = float(np.linalg.norm(b.ravel()))
    return d / s if s > 0 else d


def compare_step(prev, kstate, mstate, kloss, mrec):
    """One step's figures: loss, scale/skips, and per tensor the update difference
    max |dW_mpx - dW_keras| / max |dW_keras| (and the same in the 2-norm) and the
    after-step difference."""
    loss_rel = abs(mrec["loss"] - kloss) / max(abs(kloss), 1e-30)
    same = mrec["loss_scale"] == kstate["scale"] and mrec["skipped_steps"] == kstate["skipped"]
    upd, upd2, after = {}, {}, {}
    for name, w0 in prev["weights"].items():
        kw, mw = kstate["weights"][name], mstate[name]
        dm, dk = mw.astype(np.float64) - w0, kw.astype(np.float64) - w0
        upd[name], upd2[name] = rel(dm, dk), rel2(dm, dk)
        after[name] = rel(mw, kw.astype(np.float64))
    return {"loss_rel": loss_rel, "scale_same": same, "update_rel": upd, "update_rel2": upd2, "after_rel": after}


def run_reset(a, cfg, policy, cfg_path, work, x, y, snaps, keras_losses, data_src, env):
    """Drives mpx one step from each Keras state; returns the per-step comparisons."""
    import yaml
    base = os.path.join(work, f"reset-{policy}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    tmpl_run = os.path.join(base, "template")
    c = json.loads(json.dumps(cfg))
    c["data"].update(train_limit=a.batch, test_limit=a.batch)
    c["train"].update(epochs=1, max_steps=1)
    one_batch_data(cfg["data"]["dataset"], data_src, os.path.join(base, "data-0"), x[:a.batch], y[:a.batch])
    c["data"]["path"] = os.path.join(base, "data-0")
    rcfg = os.path.join(base, "reset.yaml")
    with open(rcfg, "w") as f:
        yaml.safe_dump(c, f, sort_keys=False)
    _mpx(a, ["train", "--config", rcfg, "--run-dir", tmpl_run, "--no-progress", "-q"], env)
    head, secs = read_ckpt(os.path.join(tmpl_run, "checkpoints", "last.ckpt"))
    amap = arena_map(a.mpx, rcfg, os.path.join(tmpl_run, "checkpoints", "last.ckpt"), base, env)
    missing = sorted(set(snaps[0]["weights"]) ^ set(amap))
    if missing:
        raise SystemExit("tensors not in both frameworks: " + ", ".join(missing))
    out = []
    for k in range(1, len(keras_losses) + 1):
        sl = slice((k - 1) * a.batch, k * a.batch)
        data_k = os.path.join(base, f"data-{k}")
        one_batch_data(cfg["data"]["dataset"], data_src, data_k, x[sl], y[sl])
        h, arenas = checkpoint_from(snaps[k - 1], head, secs, amap, k)
        ck = os.path.join(base, f"from-keras-{k}.ckpt")
        write_ckpt(ck, h, arenas)
        run = os.path.join(base, f"run-{k}")
        step_env = dict(env)
        if k == a.inject_inf:
            step_env["MPX_DEBUG_INJECT_INF"] = f"0:{k - 1}"
        _mpx(a, ["train", "--config", rcfg, "--run-dir", run, "--resume", ck, "--no-progress", "-q",
                 "--set", f"data.path={data_k}", "--set", f"train.max_steps={k}"], step_env)
        rec, after = _result(run, amap)
        out.append(compare_step(snaps[k - 1], snaps[k], after, keras_losses[k - 1], rec))
        if a.reset_floor:
            # The same step by mpx's plain loops (MPX_CPU_REFERENCE=1: other summation orders, BN
            # sums in double): how far two correct float32 implementations of it lie apart.
            run2 = run + "-loops"
            _mpx(a, ["train", "--config", rcfg, "--run-dir", run2, "--resume", ck, "--no-progress", "-q",
                     "--set", f"data.path={data_k}", "--set", f"train.max_steps={k}"],
                 dict(step_env, MPX_CPU_REFERENCE="1"))
            rec2, after2 = _result(run2, amap)
            own = {"weights": after, "scale": rec["loss_scale"], "skipped": rec["skipped_steps"]}
            out[-1]["floor"] = compare_step(snaps[k - 1], own, after2, rec["loss"], rec2)
            out[-1]["floor"]["update_scale_keras"] = {
                n: float(np.abs(snaps[k]["weights"][n].astype(np.float64) - w0).max())
                for n, w0 in snaps[k - 1]["weights"].items()}
            if not a.keep:
                shutil.rmtree(run2, ignore_errors=True)
        if not a.keep:
            shutil.rmtree(run, ignore_errors=True)
            shutil.rmtree(data_k, ignore_errors=True)
            os.remove(ck)
    return out


def _result(run, amap):
    """The last step record of a run and its state after it (keras layout)."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rec = [r for r in map(json.loads, f) if r.get("kind") == "step"][-1]
    _, after = read_ckpt(os.path.join(run, "checkpoints", "last.ckpt"))
    return rec, mpx_state(amap, after)


def _mpx(a, args, env):
    r = subprocess.run([a.mpx] + args, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mpx {' '.join(args)} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")


def summarize(steps, skip_tensors=()):
    """Largest per-step loss difference and update difference (with the tensor and step)."""
    loss = max(s["loss_rel"] for s in steps)
    loss_step = 1 + max(range(len(steps)), key=lambda i: steps[i]["loss_rel"])
    worst = (0.0, "", 0)
    worst_after, worst2 = (0.0, "", 0), (0.0, "", 0)
    for i, s in enumerate(steps):
        for n, v in s["update_rel"].items():
            if n not in skip_tensors and v > worst[0]:
                worst = (v, n, i + 1)
        for n, v in s.get("update_rel2", {}).items():
            if n not in skip_tensors and v > worst2[0]:
                worst2 = (v, n, i + 1)
        for n, v in s["after_rel"].items():
            if n not in skip_tensors and v > worst_after[0]:
                worst_after = (v, n, i + 1)
    floor = {}
    if all("floor" in s for s in steps):
        fl = [s["floor"] for s in steps]
        floor = {"floor_loss_rel": max(f["loss_rel"] for f in fl),
                 "floor_update_rel": max(max(f["update_rel"][n] for n in f["update_rel"] if n not in skip_tensors)
                                         for f in fl),
                 "floor_update_rel2": max(max(f["update_rel2"][n] for n in f["update_rel2"] if n not in skip_tensors)
                                          for f in fl)}
    return {**floor, "loss_rel": loss, "loss_step": loss_step, "update_rel": worst[0], "update_tensor": worst[1],
            "update_step": worst[2], "update_rel2": worst2[0], "update2_tensor": worst2[1],
            "after_rel": worst_after[0], "after_tensor": worst_after[1],
            "after_step": worst_after[2], "scale_same": all(s["scale_same"] for s in steps)}
