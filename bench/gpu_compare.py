#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mpx vs PyTorch on the GPU, side by side in one run (the GPU benchmark).

For the reference CIFAR net (configs/cifar10_fp32.yaml) and the CIFAR ResNet
(configs/cifar10_resnet.yaml) at batch 512, under float32 / mixed_float16 /
mixed_bfloat16: images/s and peak memory of `mpx bench --json` and of the same
net in PyTorch (eager, channels_last, cudnn.benchmark=True; float32 with TF32
off like mpx; autocast + GradScaler for float16; bf16 autocast), the same
optimizer, random data already on the GPU. Prints a table last and writes JSON.

    python3 bench/gpu_compare.py --mpx gpu-bundle/app/mpx --out $OUT/gpu_compare.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

import yaml

POLICIES = ["float32", "mixed_float16", "mixed_bfloat16"]
CONFIGS = ["configs/cifar10_fp32.yaml", "configs/cifar10_resnet.yaml"]


# ---- mpx ---------------------------------------------------------------------------

def run_mpx(mpx, config, policy, batch, steps, warmup):
    cmd = [mpx, "bench", "--config", config, "--steps", str(steps), "--warmup", str(warmup), "--json",
           "--set", "device=cuda", "--set", f"policy={policy}", "--set", f"data.batch_size={batch}"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-400:]}"}
    line = [l for l in p.stdout.splitlines() if l.strip().startswith("{")]
    r = json.loads(line[-1])
    r["wall_s"] = round(time.time() - t0, 1)
    return r


# ---- PyTorch -----------------------------------------------------------------------

def build_torch(cfg, torch, nn, F):
    """The config's layers as a torch module (Keras semantics: 'same' padding,
    BN momentum 0.99 / epsilon 1e-3, residual with a 1x1 projection when shapes differ)."""
    from mpx_torch_net import torch_activation  # the activations' PyTorch twins, in one place

    H, W, C = cfg["model"].get("input_shape", [32, 32, 3])

    class SameConv(nn.Module):
        def __init__(self, cin, cout, k, s, same, bias):
            super().__init__()
            self.k, self.s, self.same = k, s, same
            self.conv = nn.Conv2d(cin, cout, k, s, 0, bias=bias)

        def forward(self, x):
            if self.same:
                h, w = x.shape[-2:]
                ph = max((-(-h // self.s) - 1) * self.s + self.k - h, 0)
                pw = max((-(-w // self.s) - 1) * self.s + self.k - w, 0)
                x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
            return self.conv(x)

    class Residual(nn.Module):
        def __init__(self, body, proj):
            super().__init__()
            self.body, self.proj = body, proj

        def forward(self, x):
            return self.body(x) + (self.proj(x) if self.proj is not None else x)

    def pair(v, default):
        if v is None:
            return default
        return tuple(v) if isinstance(v, list) else (v, v)

    def seq(layers, shape):
        mods = []
        c, h, w = shape
        for L in layers:
            t = L["type"]
            if t == "conv2d":
                k = pair(L.get("kernel"), (3, 3))[0]
                s = pair(L.get("strides", L.get("stride")), (1, 1))[0]
                same = L.get("padding", "valid") == "same"
                mods.append(SameConv(c, L["filters"], k, s, same, L.get("use_bias", True)))
                c = L["filters"]
                h = -(-h // s) if same else (h - k) // s + 1
                w = -(-w // s) if same else (w - k) // s + 1
                if torch_activation(L) is not None:
                    mods.append(torch_activation(L, inplace=True))
            elif t == "batch_norm":
                mods.append(nn.BatchNorm2d(c, eps=1e-3, momentum=0.01) if h else nn.BatchNorm1d(c, eps=1e-3,
                                                                                                momentum=0.01))
            elif t == "activation":
                if torch_activation(L) is not None:
                    mods.append(torch_activation(L, inplace=True))
            elif t in ("max_pool", "avg_pool"):
                k = pair(L.get("pool_size", L.get("size")), (2, 2))[0]
                s = pair(L.get("strides", L.get("stride")), (k, k))[0]
                mods.append(nn.MaxPool2d(k, s) if t == "max_pool" else nn.AvgPool2d(k, s))
                h, w = (h - k) // s + 1, (w - k) // s + 1
            elif t == "global_avg_pool":
                mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
                h = w = 0
            elif t == "flatten":
                mods.append(nn.Flatten())
                c, h, w = c * h * w, 0, 0
            elif t == "dropout":
                mods.append(nn.Dropout(L.get("rate", 0.5)))
            elif t == "dense":
                mods.append(nn.Linear(c, L["units"], bias=L.get("use_bias", True)))
                c = L["units"]
                if torch_activation(L) is not None:
                    mods.append(torch_activation(L, inplace=True))
            elif t == "residual":
                body, (c2, h2, w2) = seq(L["layers"], (c, h, w))
                proj = None
                if (c2, h2, w2) != (c, h, w):
                    s = max(h // h2, 1) if h2 else 1
                    proj = nn.Conv2d(c, c2, 1, s, bias=False)
                mods.append(Residual(body, proj))
                c, h, w = c2, h2, w2
            else:
                raise ValueError(f"layer type {t} not in the PyTorch twin")
        return nn.Sequential(*mods), (c, h, w)

    net, _ = seq(cfg["model"]["layers"], (C, H, W))
    return net, (C, H, W)


def run_torch(config, policy, batch, steps, warmup):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # mpx float32 is true float32
    torch.backends.cuda.matmul.allow_tf32 = False
    with open(config) as f:
        cfg = yaml.safe_load(f)
    torch.manual_seed(0)
    net, (C, H, W) = build_torch(cfg, torch, nn, F)
    net = net.cuda().to(memory_format=torch.channels_last)
    o = cfg.get("optimizer", {})
    if o.get("name", "adam") == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=o.get("learning_rate", 0.01), momentum=o.get("momentum", 0.0),
                              nesterov=o.get("nesterov", False), weight_decay=o.get("weight_decay", 0.0))
    else:
        opt = torch.optim.Adam(net.parameters(), lr=o.get("learning_rate", 1e-3), eps=o.get("epsilon", 1e-7))
    x = torch.randn(batch, C, H, W, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device="cuda")
    amp_dtype = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(policy)
    scaler = torch.amp.GradScaler("cuda", enabled=policy == "mixed_float16")
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            out = net(x)
        loss = loss_fn(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    total = sum(times)
    return {"images_per_sec": batch * steps / total, "step_ms_median": 1e3 * times[len(times) // 2],
            "peak_memory_bytes": torch.cuda.max_memory_allocated(), "policy": policy, "batch_size": batch,
            "steps": steps}


# ---- main --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mpx", default="gpu-bundle/app/mpx")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--configs", nargs="*", default=CONFIGS)
    ap.add_argument("--policies", nargs="*", default=POLICIES)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_compare.json"))
    a = ap.parse_args()

    rows = []
    for config in a.configs:
        for policy in a.policies:
            name = os.path.basename(config).replace(".yaml", "")
            print(f"-- {name} {policy}: mpx", flush=True)
            m = run_mpx(a.mpx, config, policy, a.batch, a.steps, a.warmup)
            print(f"   {m}", flush=True)
            print(f"-- {name} {policy}: torch", flush=True)
            try:
                t = run_torch(config, policy, a.batch, a.steps, a.warmup)
            except Exception as e:  # keep the other rows
                t = {"error": repr(e)[:400]}
            print(f"   {t}", flush=True)
            rows.append({"config": name, "policy": policy, "mpx": m, "torch": t})

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"batch_size": a.batch, "steps": a.steps, "warmup": a.warmup, "rows": rows}, f, indent=2)

    def f_ips(r):
        return f"{r['images_per_sec']:.0f}" if "images_per_sec" in r else "error"

    def f_mem(r):
        return f"{r['peak_memory_bytes'] / 2**20:.0f}" if "peak_memory_bytes" in r else "-"

    print(f"\n{'net':<16} {'policy':<15} {'mpx img/s':>10} {'torch img/s':>12} {'mpx/torch':>9} "
          f"{'mpx MiB':>8} {'torch MiB':>9} {'mpx act MiB':>11} {'mpx pipelined':>13}")
    for r in rows:
        m, t = r["mpx"], r["torch"]
        ratio = (f"{m['images_per_sec'] / t['images_per_sec']:.2f}"
                 if "images_per_sec" in m and "images_per_sec" in t else "-")
        act = f"{m['activation_bytes'] / 2**20:.0f}" if "activation_bytes" in m else "-"
        pipe = m.get("images_per_sec_pipelined")
        pipe = f"{pipe:.0f}" if pipe else "-"
        print(f"{r['config']:<16} {r['policy']:<15} {f_ips(m):>10} {f_ips(t):>12} {ratio:>9} {f_mem(m):>8} "
              f"{f_mem(t):>9} {act:>11} {pipe:>13}")
    print(f"\nJSON: {a.out}")
    return 0 if all("error" not in r["mpx"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
