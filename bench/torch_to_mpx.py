#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch -> safetensors (pytorch layout) -> `mpx eval --weights`: the other direction.

Builds the PyTorch twin of an mpx config (bench/mpx_torch_net.py), initializes it with
PyTorch's own initializers (torch.manual_seed), optionally trains it for a few Adam
steps on the training split (so the accuracy means something and the batch-norm
running statistics move), saves its state_dict with safetensors.torch.save_file
(PyTorch's names, num_batches_tracked included, no metadata: mpx recognizes the
layout from the names), then compares PyTorch's own test loss and accuracy with
`mpx eval --weights`.

    bench/.venv/bin/python bench/torch_to_mpx.py --config configs/mnist_smoke.yaml --data ../shared/data/mnist

Exit 0 when the losses agree within --tol (default 1e-4 under float32) and the
accuracies are equal.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpx_torch_net as mt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", help="data folder (default: the config's data.path)")
    ap.add_argument("--mpx", default=os.path.join(ROOT, "build", "app", "mpx"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-steps", type=int, default=100, help="Adam steps in PyTorch before export (0 = init only)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--test-limit", type=int, default=0, help="first N test images (0 = all)")
    ap.add_argument("--out", help="keep the weights file here")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = mt.load_config(a.config)
    dataset = cfg["data"]["dataset"]
    data = a.data or cfg.get("data", {}).get("path") or f"data/{dataset}"
    mean, std = mt.normalization(cfg)
    x_test, y_test = mt.read_split(dataset, data, "test", a.test_limit)
    net = mt.MpxNet(cfg, mt.input_hwc(cfg, x_test), flatten="nchw")

    if a.train_steps > 0:
        x_train, y_train = mt.read_split(dataset, data, "train")
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        rng = np.random.default_rng(a.seed)
        net.train()
        for step in range(a.train_steps):
            idx = rng.integers(0, len(y_train), a.batch)
            loss = F.cross_entropy(net(mt.normalize(x_train[idx], mean, std)), torch.from_numpy(y_train[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"pytorch: {a.train_steps} Adam steps of {a.batch}, last batch loss {loss.item():.4f}")

    net.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y_test), 500):
            logits = net(mt.normalize(x_test[i:i + 500], mean, std)).double()
            y = torch.from_numpy(y_test[i:i + 500])
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
    t_loss, t_acc = loss_sum / len(y_test), correct / len(y_test)

    with tempfile.TemporaryDirectory() as tmp:
        wfile = a.out or os.path.join(tmp, "torch.safetensors")
        sd = net.to_mpx()
        save_file(sd, wfile)
        cmd = [a.mpx, "eval", "--config", a.config, "--weights", wfile, "--json",
               "--set", f"data.path={os.path.abspath(data)}", "--set", "device=cpu",
               "--set", f"data.test_limit={a.test_limit}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
            return r.returncode
        m = json.loads(r.stdout)
    print(f"pytorch eval: loss {t_loss:.6f}, accuracy {t_acc:.4f} ({len(y_test)} images)")
    print(f"mpx eval:     loss {m['loss']:.6f}, accuracy {m['accuracy']:.4f} ({m['count']} images, {m['policy']})")
    dl = abs(t_loss - m["loss"])
    ok = dl < a.tol and abs(t_acc - m["accuracy"]) < 0.5 / len(y_test) and m["count"] == len(y_test)
    print(f"{'OK' if ok else 'FAIL'}: |loss difference| {dl:.3e}, accuracy difference {abs(t_acc - m['accuracy']):.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
