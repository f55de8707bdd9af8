#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# PyTorch peer of `mpx bench`: times the same nets (forward + cross-entropy +
# backward + Adam) at the same batch on the CPU, in float32 or under
# torch.autocast(bfloat16). A peer for side-by-side numbers, not a dependency
# of mpx. Needs torch (Debian: python3-torch, or pip).
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn


def smoke_net():
    # configs/mnist_smoke.yaml: conv 32 3x3 relu, max_pool 2, flatten, dense 10.
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 13 * 13, 10)), (1, 28, 28)


def cifar_net():
    # configs/cifar10_fp32.yaml: the reference net of the Keras mixed-precision guides.
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 256), nn.ReLU(),
                         nn.Linear(256, 10)), (3, 32, 32)


NETS = {"smoke": smoke_net, "cifar": cifar_net}


def bench(name, batch, steps, warmup, dtype):
    torch.manual_seed(0)
    model, (c, h, w) = NETS[name]()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    x = torch.randn(batch, c, h, w).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if dtype == "bfloat16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = loss_fn(out.float(), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
    med = statistics.median(times)
    return {"peer": "pytorch", "torch_version": torch.__version__, "net": name, "dtype": dtype,
            "batch_size": batch, "threads": torch.get_num_threads(), "images_per_sec": batch / (med / 1e3),
            "step_ms_median": med, "step_ms_min": min(times), "step_ms_max": max(times)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--net", choices=sorted(NETS) + ["all"], default="all")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "all"], default="float32")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    nets = sorted(NETS) if a.net == "all" else [a.net]
    dtypes = ["float32", "bfloat16"] if a.dtype == "all" else [a.dtype]
    rows = [bench(n, a.batch, a.steps, a.warmup, d) for n in nets for d in dtypes]
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        for r in rows:
            print(f"pytorch {r['torch_version']} {r['net']:6s} {r['dtype']:9s} batch {r['batch_size']} "
                  f"threads {r['threads']}: {r['images_per_sec']:8.1f} images/s "
                  f"(step median {r['step_ms_median']:.1f} ms, min {r['step_ms_min']:.1f}, max {r['step_ms_max']:.1f})")


if __name__ == "__main__":
    main()
