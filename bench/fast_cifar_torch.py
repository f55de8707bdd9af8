#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch twin of the fast-CIFAR recipe: trains an mpx config in PyTorch on the CPU, as mpx trains it.

The net is bench/mpx_torch_net.py's twin of the YAML file's model (channels_last,
symmetric "same" padding inside the convolution as in bench/torch_peer.py), and
every piece of the recipe follows docs/fast-cifar.md:

- data ("Augmentation"): the same training records in the same order with the
  same translations and flips as mpx's loader, because this file reproduces
  mpx's random streams (xoshiro256** seeded by splitmix64, lib/core/rng.h): the
  epoch's Fisher-Yates order from (seed, epoch), each record's offsets and coin
  from the counter hash of (seed, epoch, record); reflect padding; the
  alternating flip; drop_last.
- initialization: Glorot uniform drawn from mpx's per-tensor streams (the same
  values as mpx's for the same seed), "Dirac initialization" over it, "Patch
  whitening" from the first whitening_images training records in float64
  (numpy's eigh instead of mpx's Jacobi rotations: the same filters to rounding).
- "Batch norm without a learned scale": gamma fixed at 1; the moving statistics
  in Keras' convention (PyTorch momentum = 1 - mpx momentum; the moving variance
  unbiased on 4-D input in both); the config's epsilon.
- "Logits times a constant": output_scale on the dense layer; a layer's
  `dtype: float32` keeps it out of autocast.
- "Label smoothing": the mean over the batch of the smoothed cross-entropy
  (F.cross_entropy(label_smoothing=e) is the same target (1 - e) onehot + e / K).
- "Parameter groups": lr_multipliers, weight_decay_multipliers and
  freeze_after_epochs, globs over mpx's "<layer>/<param>" names (kernel, bias,
  gamma, beta); a rule matching no trainable parameter is refused.
- the optimizer ("The recipe"): Keras' SGD as mpx runs it, per element in
  float32: g += wd w; v = m v - lr g; w += m v - lr g (Nesterov) or w += v.
- "The triangular schedule": per step, numpy's interp over (0, round(peak T), T).
- "Lookahead": every k global steps, over the weights and the batch-norm moving
  statistics, and once more with decay 1 after the last step.
- "Test-time augmentation": the views and weights of train.tta, logits averaged
  in float64; loss and accuracy of the average.

Evaluation ("Time to a target accuracy") follows train.eval_every (after the
last epoch and every eval_every-th one), on the test split of DIR/cifar10
(data.test_limit applies); train.target_accuracy records the first evaluation
that meets it and train.stop_at_target ends the run there. The clock runs from
the first training step to the end of the last evaluation, as mpx's; the data
reading, whitening, initialization, the epochs' orders and (with --compile) the
compiler's warm-up run before it and are reported apart. The 10,000
JPEG-decoded records are evaluated after the clock stops (mpx's bench runs
`mpx eval` for them). images/s is the training images over the summed step
times, which start once the batch is made, as mpx's (the augmentation's share
is reported beside it).

    ~/.cache/mpx-peers/torch/bin/python bench/fast_cifar_torch.py --config configs/cifar10_fast.yaml \\
        --data ../shared/data [--policy mixed_bfloat16] [--seed 1] [--epochs 1] [--compile] [--json]

Needs torch, numpy and pyyaml (bench/torch_setup.sh). bench/fast_cifar.sh --peer torch runs it
beside mpx (docs/fast-cifar.md, "Measuring it").
"""
import argparse
import fnmatch
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mpx_torch_net as mt  # noqa: E402
import peer_common as pc  # noqa: E402

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ---- mpx's random streams (lib/core/rng.h, rng.cpp) -------------------------------

def mix64(x):
    """splitmix64's finalizer of one word (mpx::mix64)."""
    x = (x + GOLDEN) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def mix64_np(x):
    """mix64 over a numpy uint64 array (the products wrap modulo 2^64, as in C++)."""
    x = x + np.uint64(GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_uniform_np(seed, index):
    """mpx::hash_uniform(seed, index) for an array of indices: float32 in [0, 1)."""
    with np.errstate(over="ignore"):
        h = mix64_np(np.uint64(seed) ^ mix64_np(index.astype(np.uint64)))
    return (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def fnv1a(s):
    h = 1469598103934665603
    for b in s.encode():
        h = ((h ^ b) * 1099511628211) & M64
    return h


class Rng:
    """mpx::Rng: xoshiro256** seeded by splitmix64."""

    def __init__(self, seed):
        s, x = [], seed & M64
        for _ in range(4):
            x = (x + GOLDEN) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            s.append(z ^ (z >> 31))
        self.s = s

    def next_u64(self):
        s0, s1, s2, s3 = self.s
        r = (s1 * 5) & M64
        result = ((((r << 7) | (r >> 57)) & M64) * 9) & M64
        t = (s1 << 17) & M64
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = ((s3 << 45) | (s3 >> 19)) & M64
        self.s = [s0, s1, s2, s3]
        return result

    def uniform(self):
        return (self.next_u64() >> 11) * 2.0 ** -53

    def uniform_int(self, n):
        limit = M64 - M64 % n
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n

    def uniforms(self, n, lo, hi):
        """n values lo + (hi - lo) u in float64, u = uniform(), in draw order (a tight loop of next_u64)."""
        s0, s1, s2, s3 = self.s
        out = np.empty(n, dtype=np.uint64)
        for i in range(n):
            r = (s1 * 5) & M64
            out[i] = ((((r << 7) | (r >> 57)) & M64) * 9) & M64
            t = (s1 << 17) & M64
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = ((s3 << 45) | (s3 >> 19)) & M64
        self.s = [s0, s1, s2, s3]
        u = (out >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return lo + (hi - lo) * u


# ---- the loader (lib/data/loader.cpp; docs/fast-cifar.md, "Augmentation") ----------

class Loader:
    """The batches of mpx's Loader for (seed, epoch): order, translation, flip; uint8 NHWC."""

    def __init__(self, images, labels, cfg, seed):
        d = cfg["data"]
        a = d.get("augment") or {}
        self.images, self.labels, self.seed = images, labels, seed & M64
        self.batch = int(d.get("batch_size", 32))
        self.shuffle = bool(d.get("shuffle", True))
        self.drop_last = bool(d.get("drop_last", False))
        self.pad = int(a.get("random_crop_padding", 0))
        self.reflect = a.get("padding_mode", "zeros") == "reflect"
        self.flip = bool(a.get("horizontal_flip", False))
        self.alternating = a.get("flip_mode", "random") == "alternating"
        n, h, w = images.shape[:3]
        if self.reflect and self.pad > 0 and (self.pad >= h or self.pad >= w):
            raise SystemExit(f"data.augment.padding_mode: reflect needs random_crop_padding ({self.pad}) < {h}, {w}")
        self.steps = n // self.batch if self.drop_last else -(-n // self.batch)
        if self.steps <= 0:
            raise SystemExit(f"data.drop_last with batch_size {self.batch} leaves no batch of the {n} training records")

    def order(self, epoch):
        n = len(self.labels)
        order = list(range(n))
        if self.shuffle:  # Fisher-Yates from (seed, epoch)
            rng = Rng(mix64(self.seed ^ (epoch + 1)))
            for i in range(n - 1, 0, -1):
                j = rng.uniform_int(i + 1)
                order[i], order[j] = order[j], order[i]
        return np.array(order, dtype=np.int64)

    def augment_seed(self, epoch):
        return mix64(self.seed ^ mix64((0x617567 + epoch) & M64))

    def batch_images(self, idx, epoch):
        """The augmented records idx (dataset indices) of `epoch`, uint8 [n, H, W, C]."""
        src = self.images[idx]
        if self.pad == 0 and not self.flip:
            return src
        n, H, W, _ = src.shape
        key = idx.astype(np.uint64) * np.uint64(4)
        seed = self.augment_seed(epoch)
        dy = np.zeros(n, dtype=np.int64)
        dx = np.zeros(n, dtype=np.int64)
        if self.pad > 0:
            span = 2 * self.pad + 1
            dy = np.minimum((hash_uniform_np(seed, key) * np.float32(span)).astype(np.int64), span - 1) - self.pad
            dx = np.minimum((hash_uniform_np(seed, key + np.uint64(1)) * np.float32(span)).astype(np.int64),
                            span - 1) - self.pad
        if not self.flip:
            flip = np.zeros(n, dtype=bool)
        elif self.alternating:  # epoch 0's coin, inverted on odd epochs
            flip = (hash_uniform_np(self.augment_seed(0), key + np.uint64(2)) < 0.5) != (epoch % 2 == 1)
        else:
            flip = hash_uniform_np(seed, key + np.uint64(2)) < 0.5
        ys = np.arange(H)[None, :] + dy[:, None]                                   # [n, H]
        xs = np.where(flip[:, None], W - 1 - np.arange(W)[None, :], np.arange(W)[None, :]) + dx[:, None]
        if self.reflect:
            ys = np.where(ys < 0, -ys, np.where(ys >= H, 2 * (H - 1) - ys, ys))
            xs = np.where(xs < 0, -xs, np.where(xs >= W, 2 * (W - 1) - xs, xs))
            return src[np.arange(n)[:, None, None], ys[:, :, None], xs[:, None, :]]
        valid = ((ys >= 0) & (ys < H))[:, :, None] & ((xs >= 0) & (xs < W))[:, None, :]
        out = src[np.arange(n)[:, None, None], np.clip(ys, 0, H - 1)[:, :, None], np.clip(xs, 0, W - 1)[:, None, :]]
        return out * valid[..., None].astype(np.uint8)


# ---- initialization -----------------------------------------------------------------

def glorot_mpx(seed, name, shape, fan_in, fan_out):
    """mpx's Glorot uniform of tensor `name` ("<layer>/<param>"), float32 in mpx's layout."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    rng = Rng(mix64((seed & M64) ^ fnv1a(name)))
    return rng.uniforms(int(np.prod(shape)), -limit, limit).astype(np.float32).reshape(shape)


def patch_whitening(images_u8, R, S, mean, std, eps):
    """docs/fast-cifar.md, "Patch whitening": 2 R S C filters [K, R, S, C] (float32), the eigenvalues
    (descending) and the second-moment matrix, from every R x S patch of the images (float64)."""
    n, H, W, C = images_u8.shape
    D = R * S * C
    acc, count = np.zeros((D, D)), 0
    m, s = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    for i in range(0, n, 500):
        x = (images_u8[i:i + 500].astype(np.float64) / 255.0 - m) / s
        # patch vector index (r S + s) C + c: the kernel layout [K, R, S, C]
        p = np.stack([x[:, r:H - R + 1 + r, c:W - S + 1 + c, :] for r in range(R) for c in range(S)], axis=3)
        p = p.reshape(-1, D)
        acc += p.T @ p
        count += p.shape[0]
    cov = acc / count
    vals, vecs = np.linalg.eigh(cov)          # ascending; columns are eigenvectors
    order = np.argsort(-vals, kind="stable")
    vals, vecs = vals[order], vecs[:, order].T  # rows: eigenvectors, descending eigenvalues
    big = np.argmax(np.abs(vecs), axis=1)     # each with its largest component positive
    vecs = vecs * np.where(vecs[np.arange(D), big] < 0, -1.0, 1.0)[:, None]
    f = vecs / np.sqrt(np.maximum(vals, 0.0) + eps)[:, None]
    w = np.concatenate([f, -f]).reshape(2 * D, R, S, C)
    return w.astype(np.float32), vals, cov


# ---- the net --------------------------------------------------------------------------

class Float32Layer(nn.Module):
    """A layer with `dtype: float32` in a mixed policy: outside autocast, on float32 input."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            return self.inner(x.float())


def layer_kinds(cfg):
    return {l["name"]: l for l in walk(cfg["model"]["layers"])}


def walk(layers):
    for l in layers:
        yield l
        yield from walk(l.get("layers", []))


def mpx_param_name(torch_name, kinds):
    """"block1_norm1.bias" -> "block1_norm1/beta", "whiten.conv.weight" -> "whiten/kernel"."""
    parts = torch_name.split(".")
    layer, p = parts[0], parts[-1]
    if kinds[layer]["type"] == "batch_norm":
        return f"{layer}/{ {'weight': 'gamma', 'bias': 'beta'}[p] }"
    return f"{layer}/{ {'weight': 'kernel', 'bias': 'bias'}[p] }"


def build(cfg, hwc, seed, train_images, log):
    """The twin of cfg's model with mpx's initial weights for `seed`."""
    net = mt.MpxNet(cfg, hwc, flatten="nhwc")
    kinds = layer_kinds(cfg)
    for m in net.modules():  # symmetric "same" padding inside the convolution (bench/torch_peer.py)
        if isinstance(m, mt.Conv) and any(m.pad):
            left, right, top, bottom = m.pad
            if left == right and top == bottom:
                m.conv.padding, m.pad = (top, left), (0, 0, 0, 0)
    mean, std = mt.normalization(cfg)
    with torch.no_grad():
        for name, l in kinds.items():
            mod = getattr(net, name, None)
            t = l["type"]
            if t == "conv2d":
                conv = mod.conv
                K, C, R, S = conv.weight.shape
                init = l.get("kernel_initializer", "glorot_uniform")
                if init not in ("glorot_uniform", "dirac", "patch_whitening"):
                    raise SystemExit(f"{name}: kernel_initializer {init} has no twin here")
                w = glorot_mpx(seed, f"{name}/kernel", (K, R, S, C), R * S * C, R * S * K)
                if init == "dirac":  # the first min(K, C) filters: 1 at the centre tap of their own channel
                    for f in range(min(K, C)):
                        w[f] = 0.0
                        w[f, R // 2, S // 2, f] = 1.0
                if init == "patch_whitening":
                    if l is not cfg["model"]["layers"][0] or K != 2 * R * S * C:
                        raise SystemExit(f"{name}: patch_whitening needs the first layer with 2 x R x S x C filters")
                    n = int(l.get("whitening_images", 5000))
                    t0 = time.perf_counter()
                    w, vals, _ = patch_whitening(train_images[:n], R, S, mean, std,
                                                 float(l.get("whitening_epsilon", 5e-4)))
                    log(f"{name}: patch whitening from {min(n, len(train_images))} training images in "
                        f"{time.perf_counter() - t0:.1f} s, eigenvalues {vals[0]:.3g} .. {vals[-1]:.3g}")
                conv.weight.copy_(torch.from_numpy(w).permute(0, 3, 1, 2))  # KRSC -> KCRS
                if conv.bias is not None:
                    conv.bias.zero_()
            elif t == "dense":
                lin = mod[0] if isinstance(mod, nn.Sequential) else mod
                out_f, in_f = lin.weight.shape
                lin.weight.copy_(torch.from_numpy(glorot_mpx(seed, f"{name}/kernel", (out_f, in_f), in_f, out_f)))
                if lin.bias is not None:
                    lin.bias.zero_()
            elif t == "batch_norm":
                mod.momentum = 1.0 - float(l.get("momentum", 0.99))  # Keras: moving = m moving + (1 - m) batch
                mod.eps = float(l.get("epsilon", 1e-3))
                if not l.get("scale", True):
                    mod.weight.requires_grad_(False)  # gamma fixed at 1
    for name, l in kinds.items():
        if l.get("dtype") == "float32":
            setattr(net, name, Float32Layer(getattr(net, name)))
    return net


# ---- parameter groups, schedule, optimizer, lookahead -----------------------------------

def parse_rules(key, entries):
    rules = []
    for i, e in enumerate(entries or []):
        glob, _, value = str(e).rpartition("=")
        if not glob:
            raise SystemExit(f"{key}[{i}]: \"{e}\" is not \"<layer>/<parameter>=<number>\"")
        rules.append((glob, float(value)))
    return rules


def param_groups(cfg, net):
    """[(torch name, mpx name, tensor, lr multiplier, wd multiplier, update-until epoch or None)]
    of the trainable parameters (docs/fast-cifar.md, "Parameter groups")."""
    o = cfg.get("optimizer") or {}
    kinds = layer_kinds(cfg)
    lists = {k: parse_rules(f"optimizer.{k}", o.get(k)) for k in
             ("lr_multipliers", "weight_decay_multipliers", "freeze_after_epochs")}
    params = [(n, mpx_param_name(n, kinds), p) for n, p in net.named_parameters() if p.requires_grad]
    names = [m for _, m, _ in params]
    for k, rules in lists.items():
        for i, (glob, _) in enumerate(rules):
            if not any(fnmatch.fnmatchcase(m, glob) for m in names):
                raise SystemExit(f"optimizer.{k}[{i}]: \"{glob}\" matches no trainable parameter; they are: "
                                 + ", ".join(names))

    def first(rules, name, default):
        return next((v for g, v in rules if fnmatch.fnmatchcase(name, g)), default)

    out = []
    for n, m, p in params:
        until = first(lists["freeze_after_epochs"], m, None)
        out.append((n, m, p, first(lists["lr_multipliers"], m, 1.0), first(lists["weight_decay_multipliers"], m, 1.0),
                    None if until is None else int(round(until))))
    return out


class Schedule:
    """lib/train/schedule.cpp's constant and triangular schedules, with warmup_epochs."""

    def __init__(self, cfg, epochs, steps_per_epoch):
        s = cfg.get("schedule") or {}
        self.name = s.get("name", "constant")
        if self.name not in ("constant", "triangular"):
            raise SystemExit(f"schedule.name {self.name} has no twin here (constant, triangular)")
        self.base = float(cfg["optimizer"].get("learning_rate", 1e-3))
        self.total = max(1, epochs) * steps_per_epoch
        self.peak = int(math.floor(float(s.get("peak_fraction", 0.2)) * self.total + 0.5))  # llround
        self.start, self.end = float(s.get("start_factor", 0.2)), float(s.get("end_factor", 0.0))
        self.warmup = int(round(max(0.0, float(s.get("warmup_epochs", 0))) * steps_per_epoch))

    def lr(self, step):
        lr = self.base
        if self.name == "triangular":
            lr = self.base * float(np.interp(min(max(step, 0), self.total), [0, self.peak, self.total],
                                             [self.start, 1.0, self.end]))
        if step < self.warmup:
            lr *= (step + 1) / self.warmup
        return lr


class KerasSgd:
    """mpx's SGD (lib/backend/cpu/optimizer.cpp, Keras' form) per group, float32 per element."""

    def __init__(self, cfg, groups):
        o = cfg["optimizer"]
        if o.get("name", "adam") != "sgd":
            raise SystemExit(f"optimizer.name {o.get('name')}: this twin runs sgd only")
        self.m, self.nesterov = float(o.get("momentum", 0.0)), bool(o.get("nesterov", False))
        self.wd = float(o.get("weight_decay", 0.0))
        self.groups = groups
        self.v = {n: torch.zeros_like(p) for n, _, p, *_ in groups} if self.m != 0 else {}

    @torch.no_grad()
    def step(self, lr, epoch):
        lr32 = float(np.float32(lr))
        for n, _, p, lr_mult, wd_mult, until in self.groups:
            # A frozen parameter (multiplier 0, or past its epochs) is not touched, nor its momentum.
            if lr_mult == 0 or (until is not None and epoch >= until) or p.grad is None:
                continue
            a = float(np.float32(lr32 * np.float32(lr_mult)))
            wd = float(np.float32(self.wd) * np.float32(wd_mult))
            g = p.grad
            if wd != 0:
                g = g.add(p, alpha=wd)
            if self.m != 0:
                v = self.v[n]
                v.mul_(self.m).add_(g, alpha=-a)             # v = m v - lr g
                if self.nesterov:
                    p.add_(v, alpha=self.m).add_(g, alpha=-a)  # w += m v - lr g
                else:
                    p.add_(v)
            else:
                p.add_(g, alpha=-a)


class Lookahead:
    """docs/fast-cifar.md, "Lookahead": avg += (1 - d)(w - avg); w = avg over the weights and the
    batch-norm moving statistics; d = decay (step / total)^power."""

    def __init__(self, cfg, net, total):
        la = (cfg.get("train") or {}).get("lookahead") or {}
        self.every = int(la.get("every", 0))
        self.decay, self.power = float(la.get("decay", 0.7737809375)), float(la.get("power", 3.0))
        self.total = max(1, total)
        self.tensors = [p for p in net.parameters()] + [b for n, b in net.named_buffers()
                                                        if n.endswith(("running_mean", "running_var"))]
        self.avg = [t.detach().clone() for t in self.tensors] if self.every > 0 else []

    def decay_at(self, step):
        return self.decay * min(1.0, step / self.total) ** self.power

    @torch.no_grad()
    def mix(self, decay):
        t = float(np.float32(1.0 - decay))
        for a, w in zip(self.avg, self.tensors):
            a.add_(w - a, alpha=t)
            w.copy_(a)

    def after_step(self, global_step):  # global_step: the steps done
        if self.every > 0 and global_step % self.every == 0:
            self.mix(self.decay_at(global_step))


# ---- evaluation (docs/fast-cifar.md, "Test-time augmentation") ---------------------------

TTA_VIEWS = {"none": [(0, False, 1.0)],
             "mirror": [(0, False, 0.5), (0, True, 0.5)],
             "mirror_translate": [(0, False, 0.25), (0, True, 0.25), (-1, False, 0.125), (-1, True, 0.125),
                                  (1, False, 0.125), (1, True, 0.125)]}


def tta_view(images, shift, flip):
    """Output pixel (h, w) = input (h + shift, w' + shift), w' the mirrored column when flip, reflected
    about the edge pixel outside the image."""
    _, H, W, _ = images.shape

    def reflect(i, n):
        return np.where(i < 0, -i, np.where(i >= n, 2 * n - 2 - i, i))

    rows = reflect(np.arange(H) + shift, H)
    cols = reflect((W - 1 - np.arange(W) if flip else np.arange(W)) + shift, W)
    return images[:, rows][:, :, cols]


def to_input(u8_nhwc, a, b):
    """mpx's normalize_input, x / (255 std) - mean / std in float32, as NCHW channels_last."""
    x = torch.from_numpy(np.ascontiguousarray(u8_nhwc)).permute(0, 3, 1, 2)  # a channels_last view
    return x.float().mul_(a).add_(b)


def evaluate(model, images, labels, views, batch, a, b, amp):
    """Weighted mean of the views' logits (float64), its plain cross-entropy and accuracy; the predictions."""
    model.eval()
    preds, loss = [], 0.0
    with torch.inference_mode():
        for i in range(0, len(labels), batch):
            chunk = images[i:i + batch]
            z = np.zeros((len(chunk), mt.NUM_CLASSES))
            for shift, flip, weight in views:
                x = to_input(tta_view(chunk, shift, flip) if (shift or flip) else chunk, a, b)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    out = model(x)
                z += weight * out.float().double().numpy()
            y = labels[i:i + batch]
            mx = z.max(axis=1, keepdims=True)
            lse = mx[:, 0] + np.log(np.exp(z - mx).sum(axis=1))
            loss += float((lse - z[np.arange(len(y)), y]).sum())
            preds.append(z.argmax(axis=1))
    model.train()
    p = np.concatenate(preds)
    return {"accuracy": float((p == labels).mean()), "loss": loss / len(labels), "count": int(len(labels))}, p


# ---- the run ----------------------------------------------------------------------------

def run(a):
    torch.set_num_threads(a.threads)
    cfg = mt.load_config(a.config)
    t = cfg.setdefault("train", {})
    policy = a.policy or cfg.get("policy", "float32")
    if policy not in ("float32", "mixed_bfloat16"):
        raise SystemExit(f"policy {policy}: this twin runs float32 and mixed_bfloat16")
    seed = a.seed if a.seed is not None else int(cfg.get("seed", 42))
    epochs = a.epochs or int(t.get("epochs", 1))
    if a.width_divisor > 1:  # narrower nets for quick checks: every conv2d but the whitening one
        for l in walk(cfg["model"]["layers"]):
            if l["type"] == "conv2d" and l.get("kernel_initializer") != "patch_whitening":
                l["filters"] = max(1, int(l["filters"]) // a.width_divisor)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if a.json else (lambda s: print(s, flush=True))
    amp = policy == "mixed_bfloat16"
    d = cfg["data"]
    if d.get("dataset") != "cifar10" or float(d.get("validation_split", 0) or 0) != 0:
        raise SystemExit("this twin reads cifar10 without a validation split")
    train_x, train_y = mt.read_split("cifar10", os.path.join(a.data, "cifar10"), "train",
                                     a.train_limit or int(d.get("train_limit", 0) or 0))
    test_x, test_y = mt.read_split("cifar10", os.path.join(a.data, "cifar10"), "test", int(d.get("test_limit", 0) or 0))
    jpeg_dir = os.path.join(a.data, "cifar10-test-jpeg")
    hwc = pc.input_shape(cfg)
    mean, std = mt.normalization(cfg)
    norm_a = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32).view(1, -1, 1, 1)
    norm_b = (-torch.tensor(mean, dtype=torch.float32) / torch.tensor(std, dtype=torch.float32)).view(1, -1, 1, 1)

    t_setup = time.perf_counter()
    torch.manual_seed(seed)
    net = build(cfg, hwc, seed, train_x, log).to(memory_format=torch.channels_last)
    groups = param_groups(cfg, net)
    for _, _, p, lr_mult, *_ in groups:  # never updated: no gradient needed (airbench's requires_grad = False)
        if lr_mult == 0:
            p.requires_grad_(False)
    groups = [g for g in groups if g[3] != 0]
    loader = Loader(train_x, train_y, cfg, seed)
    steps = loader.steps
    sched = Schedule(cfg, epochs, steps)
    opt = KerasSgd(cfg, groups)
    la = Lookahead(cfg, net, epochs * steps)
    smoothing = float(t.get("label_smoothing", 0.0))
    views = TTA_VIEWS[t.get("tta", "none")]
    orders = [loader.order(e) for e in range(epochs)]  # mpx's loader makes them in microseconds
    setup_s = time.perf_counter() - t_setup

    model = net
    compile_s = 0.0
    if a.compile:
        model = torch.compile(net)
        # Warm-up of the compiled forward and backward on the first batch, before the clock; the
        # weights, statistics and gradients are restored, so the run is the one without it.
        t0 = time.perf_counter()
        saved = {k: v.clone() for k, v in net.state_dict().items()}
        x = to_input(loader.batch_images(orders[0][:loader.batch], 0), norm_a, norm_b)
        y = torch.from_numpy(train_y[orders[0][:loader.batch]])
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = model(x)
            F.cross_entropy(out.float(), y, label_smoothing=smoothing).backward()
        with torch.no_grad():
            for k, v in net.state_dict().items():
                v.copy_(saved[k])
        for p in net.parameters():
            p.grad = None
        compile_s = time.perf_counter() - t0
        log(f"torch.compile warm-up: {compile_s:.1f} s")

    log(f"torch {torch.__version__}, {policy}, seed {seed}, {epochs} epochs x {steps} steps of {loader.batch}, "
        f"{torch.get_num_threads()} threads{', compiled' if a.compile else ''}; setup {setup_s:.1f} s")
    net.train()
    step_s, aug_s, cpu_s, epoch_s, epoch_loss, epoch_acc = [], 0.0, 0.0, [], [], []
    step_loss = []
    eval_every = int(t.get("eval_every", 1))
    target = float(t.get("target_accuracy", 0) or 0)
    target_s = target_epoch = None
    eval_s = 0.0
    global_step = 0
    t_first = time.perf_counter()
    for epoch in range(epochs):
        te = time.perf_counter()
        loss_sum = correct = seen = 0
        for s in range(steps):
            t0 = time.perf_counter()
            idx = orders[epoch][s * loader.batch:(s + 1) * loader.batch]
            x = to_input(loader.batch_images(idx, epoch), norm_a, norm_b)
            y = torch.from_numpy(train_y[idx])
            t1, c1 = time.perf_counter(), time.process_time()
            lr = sched.lr(global_step)
            for p in net.parameters():
                p.grad = None
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = model(x)
            logits = out.float()
            loss = F.cross_entropy(logits, y, label_smoothing=smoothing)
            loss.backward()
            opt.step(lr, epoch)
            global_step += 1
            la.after_step(global_step)
            t2 = time.perf_counter()
            cpu_s += time.process_time() - c1
            aug_s += t1 - t0
            step_s.append(t2 - t1)  # as mpx's step times: after the loader has made the batch
            n = len(idx)
            step_loss.append(float(loss.detach()))
            loss_sum += step_loss[-1] * n
            correct += int((logits.detach().argmax(1) == y).sum())
            seen += n
            if not a.json and a.log_every and (s + 1) % a.log_every == 0:
                log(f"  epoch {epoch + 1} step {s + 1}/{steps}: loss {loss_sum / seen:.4f} lr {lr:.4g} "
                    f"{seen / sum(step_s[-(s + 1):]):.0f} img/s")
        done = epoch + 1
        last = done == epochs
        if last and la.every > 0:
            la.mix(1.0)  # training ends on the averaged weights
        epoch_s.append(time.perf_counter() - te)
        epoch_loss.append(loss_sum / seen)
        epoch_acc.append(correct / seen)
        log(f"epoch {done}/{epochs}: train loss {epoch_loss[-1]:.4f} acc {epoch_acc[-1]:.4f} "
            f"(smoothed loss, augmented images) in {epoch_s[-1]:.1f} s")
        # train.eval_every as mpx: after the last epoch, and after every eval_every-th one
        if last or (eval_every > 0 and done % eval_every == 0):
            t_eval = time.perf_counter()
            final, _ = evaluate(model if a.compile_eval else net, test_x, test_y, views, loader.batch, norm_a,
                                norm_b, amp)
            t_end = time.perf_counter()
            eval_s += t_end - t_eval
            log(f"  evaluation ({t.get('tta', 'none')}) on {len(test_y)} lossless test records: acc "
                f"{final['accuracy']:.4f} loss {final['loss']:.4f}; {t_end - t_first:.1f} s from the first step "
                f"({t_end - t_eval:.1f} s evaluation)")
            if target > 0 and target_s is None and final["accuracy"] >= target:
                target_s, target_epoch = t_end - t_first, done  # 1-based, as mpx's summary
                if t.get("stop_at_target", False):
                    break
    wall = t_end - t_first
    jpeg = jpeg1k = None
    jpeg_s = 0.0
    if os.path.exists(os.path.join(jpeg_dir, "test_batch.bin")) and not a.no_jpeg:
        jx, jy = mt.read_split("cifar10", jpeg_dir, "test")
        t0 = time.perf_counter()
        jpeg, jp = evaluate(net, jx, jy, views, loader.batch, norm_a, norm_b, amp)
        jpeg_s = time.perf_counter() - t0
        k = min(1000, len(jy))
        jpeg1k = float((jp[:k] == jy[:k]).mean())
        log(f"JPEG-decoded {len(jy)}: acc {jpeg['accuracy']:.4f}; its first {k}: {jpeg1k:.4f} ({jpeg_s:.1f} s)")

    train_s = sum(step_s)
    return {"peer": "pytorch", "version": f"torch {torch.__version__}", "config": a.config, "policy": policy,
            "seed": seed, "epochs": epochs, "steps": global_step, "batch_size": loader.batch,
            "train_records": int(len(train_y)), "threads": torch.get_num_threads(), "compiled": bool(a.compile),
            "compile_seconds": compile_s, "setup_seconds": setup_s,
            "final_test_accuracy": final["accuracy"], "final_test_loss": final["loss"], "test_records": final["count"],
            "jpeg10k_accuracy": jpeg and jpeg["accuracy"], "jpeg1k_accuracy": jpeg1k, "jpeg_eval_seconds": jpeg_s,
            "wall_seconds": wall, "train_seconds": train_s, "eval_seconds": eval_s,
            "augment_seconds": aug_s, "augment_share": aug_s / (aug_s + train_s) if train_s else 0.0,
            "images_per_sec": global_step * loader.batch / train_s if train_s else 0.0,
            # CPU seconds of the process in the steps: a figure less moved by other loads on the machine
            "train_cpu_seconds": cpu_s,
            "seconds_per_epoch": statistics.mean(epoch_s), "epoch_seconds": epoch_s,
            "train_loss": epoch_loss, "train_accuracy": epoch_acc, "step_loss": step_loss,
            "step_ms_median": 1e3 * statistics.median(step_s), "first_step_ms": 1e3 * step_s[0],
            "target_accuracy": target, "target_met": target_s is not None, "target_epoch": target_epoch,
            "time_to_target_seconds": target_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/cifar10_fast.yaml", help="the mpx YAML config (the whole recipe)")
    ap.add_argument("--data", default=os.environ.get("MPX_DATA_MIRROR", "../shared/data"),
                    help="the shared data folder: DIR/cifar10 (train, 1,000 lossless test records), "
                         "DIR/cifar10-test-jpeg (10,000 JPEG-decoded)")
    ap.add_argument("--seed", type=int, help="overrides the config's seed")
    ap.add_argument("--policy", choices=["float32", "mixed_bfloat16"], help="overrides the config's "
                    "(mixed_bfloat16: torch.autocast(cpu, bfloat16))")
    ap.add_argument("--epochs", type=int, default=0, help="overrides train.epochs (the schedules follow)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch.set_num_threads (default: nproc)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the net (warm-up before the clock)")
    ap.add_argument("--compile-eval", action="store_true", help="with --compile, evaluate with the compiled net too")
    ap.add_argument("--train-limit", type=int, default=0, help="only the first N training records (data.train_limit)")
    ap.add_argument("--width-divisor", type=int, default=1, help="divide the filters of every conv2d but the "
                    "whitening one by this (quick checks)")
    ap.add_argument("--no-jpeg", action="store_true", help="skip the 10,000 JPEG-decoded records")
    ap.add_argument("--log-every", type=int, default=0, help="a line every N steps (0: per epoch)")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line of stdout")
    a = ap.parse_args()
    r = run(a)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['version']} {r['policy']} seed {r['seed']}: lossless {100 * r['final_test_accuracy']:.2f}%"
              + (f", jpeg 10k {100 * r['jpeg10k_accuracy']:.2f}%, jpeg 1k {100 * r['jpeg1k_accuracy']:.2f}%"
                 if r["jpeg10k_accuracy"] is not None else "")
              + f"; {r['wall_seconds']:.1f} s to the final evaluation, {r['seconds_per_epoch']:.1f} s/epoch, "
              f"{r['images_per_sec']:.0f} images/s (augmentation {100 * r['augment_share']:.1f}% of the steps)")


if __name__ == "__main__":
    main()
