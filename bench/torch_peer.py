#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch peer of `mpx bench`: times training steps of an mpx config's PyTorch twin on the CPU.

The twin is bench/mpx_torch_net.py's (parameter names as `mpx export --layout
pytorch` writes them), with symmetric "same" padding moved into the
convolution itself so that no separate pad runs. One step: zero_grad, forward
(under torch.autocast(cpu, bfloat16 | float16) for the mixed policies, as a
PyTorch user writes mixed precision; GradScaler for float16), cross-entropy on
float32 logits, backward, the config's optimizer. Inputs are random and
channels_last (NHWC, as mpx holds them). images/s is images / the summed step
times (as `mpx bench` reports it); --budget-s ends the timing early where a
policy is very slow. Threads: torch.set_num_threads(--threads).

    ~/.cache/mpx-peers/torch/bin/python bench/torch_peer.py --config configs/cifar10_fp32.yaml --json

Needs torch, numpy and pyyaml (bench/torch_setup.sh). Not a dependency of mpx;
the driver bench/cpu_peers.py runs it (docs/cpu-performance.md, "Against the peers").
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import mpx_torch_net as mt  # noqa: E402
import peer_common as pc  # noqa: E402

AUTOCAST = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}


def build(cfg):
    hwc = pc.input_shape(cfg)
    net = mt.MpxNet(cfg, hwc)
    for m in net.modules():  # symmetric padding: let the convolution pad (same numbers, one op less)
        if isinstance(m, mt.Conv) and any(m.pad):
            left, right, top, bottom = m.pad
            if left == right and top == bottom:
                m.conv.padding, m.pad = (top, left), (0, 0, 0, 0)
    return net, hwc


def optimizer(cfg, params):
    o = cfg.get("optimizer") or {}
    name, lr = o.get("name", "adam"), float(o.get("learning_rate", 1e-3))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(o.get("momentum", 0.0)),
                               nesterov=bool(o.get("nesterov", False)))
    betas = (float(o.get("beta1", 0.9)), float(o.get("beta2", 0.999)))
    eps = float(o.get("epsilon", 1e-7))
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=float(o.get("weight_decay", 0.0)))
    return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)


def run(a):
    torch.set_num_threads(a.threads)
    cfg = mt.load_config(a.config)
    policy = a.policy or cfg.get("policy", "float32")
    batch = a.batch or int(cfg["data"].get("batch_size", 32))
    torch.manual_seed(int(cfg.get("seed", 42)))
    net, (h, w, c) = build(cfg)
    net = net.to(memory_format=torch.channels_last)
    opt = optimizer(cfg, net.parameters())
    x = torch.randn(batch, c, h, w).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    amp = AUTOCAST.get(policy)
    scaler = torch.amp.GradScaler("cpu", enabled=policy == "mixed_float16")
    ms = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            out = net(x)
        loss = loss_fn(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        t1 = time.perf_counter()
        if i >= a.warmup:
            ms.append((t1 - t0) * 1e3)
            if a.budget_s and len(ms) >= 2 and sum(ms) > a.budget_s * 1e3:
                break
    shapes = {k: list(v.shape) for k, v in net.to_mpx().items() if not k.endswith("num_batches_tracked")}
    return {"peer": "pytorch", "version": f"torch {torch.__version__}", "config": a.config, "policy": policy,
            "batch_size": batch, "threads": torch.get_num_threads(), **pc.step_figures(batch, ms),
            "param_count": int(sum(p.numel() for p in net.parameters())), "param_shapes": shapes,
            "cpu_capability": cpu_capability()}


def cpu_capability():
    """The ISA PyTorch's own vectorized kernels were dispatched for (AVX2, AVX512, ...), where it says."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        return None


if __name__ == "__main__":
    pc.main(__doc__, run, min_warmup=0)
