#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cross-checks `mpx export` against PyTorch: the same net, the same weights, the same images.

For each layout (keras and pytorch) it exports the weights of a checkpoint (or the
config's initial weights) with `mpx export`, loads the file with the `safetensors`
package into the PyTorch twin of the config (bench/mpx_torch_net.py), runs the
first N test images through both (mpx's logits come from `mpx inspect`'s dump,
"eval/logits": inference mode) and prints the largest absolute logit difference.

    bench/.venv/bin/python bench/torch_weights_check.py --config configs/mnist_smoke.yaml \
        --checkpoint runs/smoke/checkpoints/last.ckpt --data ../shared/data/mnist

Exit 0 when every difference is below --tol (default 1e-4 under float32; the mixed
policies compute in 16 bits, so the default there is 5e-2 and the number is informative).
Needs: torch, numpy, pyyaml, safetensors (pip install safetensors).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file as np_load_file
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpx_torch_net as mt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        raise SystemExit(f"command failed with exit {r.returncode}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--checkpoint", help="checkpoint or run directory (default: the config's initial weights)")
    ap.add_argument("--weights", help="an existing exported file instead of exporting (its layout only)")
    ap.add_argument("--data", help="data folder (default: the config's data.path)")
    ap.add_argument("--images", type=int, default=256, help="first N test images (default 256)")
    ap.add_argument("--mpx", default=os.path.join(ROOT, "build", "app", "mpx"), help="the mpx binary")
    ap.add_argument("--layouts", default="keras,pytorch")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--set", action="append", default=[], help="extra --set for mpx (repeatable)")
    a = ap.parse_args()

    cfg = mt.load_config(a.config)
    data = a.data or cfg.get("data", {}).get("path") or f"data/{cfg['data']['dataset']}"
    sets = ["--set", f"data.path={os.path.abspath(data)}", "--set", "device=cpu"]
    for s in a.set:
        sets += ["--set", s]
    policy = cfg.get("policy", "float32")
    for s in a.set:
        if s.startswith("policy="):
            policy = s.split("=", 1)[1]
    tol = a.tol if a.tol is not None else (1e-4 if policy == "float32" else 5e-2)

    images, labels = mt.read_split(cfg["data"]["dataset"], data, "test", a.images)
    mean, std = mt.normalization(cfg)
    x = mt.normalize(images, mean, std)

    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        if a.weights:
            jobs.append((None, a.weights))
        else:
            for layout in a.layouts.split(","):
                out = os.path.join(tmp, f"w_{layout}.safetensors")
                cmd = [a.mpx, "export", "--config", a.config, "--out", out, "--layout", layout] + sets
                if a.checkpoint:
                    cmd += ["--checkpoint", a.checkpoint]
                run(cmd)
                jobs.append((layout, out))
        for layout, wfile in jobs:
            tensors = load_file(wfile)
            if layout is None:
                from safetensors import safe_open
                with safe_open(wfile, framework="pt") as f:
                    layout = (f.metadata() or {}).get("layout") or (
                        "keras" if any("/" in k for k in tensors) else "pytorch")
            dump = os.path.join(tmp, f"dump_{layout}.safetensors")
            run([a.mpx, "inspect", "--config", a.config, "--weights", wfile, "--batch", str(len(labels)),
                 "--out", dump] + sets)
            d = np_load_file(dump)
            mpx_logits = d["eval/logits"].astype(np.float64)
            if not np.array_equal(d["labels"], labels.astype(np.int32)):
                raise SystemExit("mpx read other images than this script (labels differ): check --data")

            net = mt.MpxNet(cfg, mt.input_hwc(cfg, images), flatten="nchw" if layout == "pytorch" else "nhwc")
            net.load_mpx(tensors, layout)
            net.eval()
            with torch.no_grad():
                torch_logits = net(x).double().numpy()
            diff = np.abs(torch_logits - mpx_logits)
            agree = float((torch_logits.argmax(1) == mpx_logits.argmax(1)).mean())
            acc = float((torch_logits.argmax(1) == labels).mean())
            worst = max(worst, float(diff.max()))
            print(f"{cfg.get('name', a.config)} [{policy}] {layout:7s} layout: {len(labels)} images, "
                  f"max |logit difference| {diff.max():.3e} (mean {diff.mean():.3e}, max |logit| "
                  f"{np.abs(torch_logits).max():.3g}), argmax agreement {agree:.4f}, torch accuracy {acc:.4f}")
    ok = worst < tol
    print(f"{'OK' if ok else 'FAIL'}: max difference {worst:.3e} {'<' if ok else '>='} {tol:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
