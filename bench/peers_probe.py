# SPDX-License-Identifier: MIT
"""What bench/cpu_peers.py reads besides the timings: the CPU, the convolution
FLOPs of a config, the layer shapes of `mpx export`, the oneDNN verbose lines
of a peer; how it runs each tool. Standard library and pyyaml only (docs/cpu-performance.md, "Against the peers")."""
import json
import re
import struct
import subprocess

import yaml

FLAGS_OF_INTEREST = ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                     "amx_bf16"]
INPUT_HWC = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def cpu_description():
    """'model name' and the flags of interest that this CPU has (from /proc/cpuinfo)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name":
                    model = val.strip()
                elif key.strip() == "flags":
                    flags = set(val.split())
                    break
    except OSError:
        pass
    return model, [f for f in FLAGS_OF_INTEREST if f in flags]


def _pair(v, default):
    if v is None:
        return (default, default)
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def conv_flops(config_path):
    """Multiply-adds x 2 per image of the config's convolutions: (forward, backward) where
    backward = the weight gradient of every convolution plus the data gradient of every
    convolution whose input is not the network's input. Top-level layers only; a config
    with residual blocks gives None (not counted here)."""
    with open(config_path) as f:
        cfg = yaml.safe_load(f)
    h, w, c = cfg["model"].get("input_shape") or INPUT_HWC[cfg["data"]["dataset"]]
    fwd = bwd = 0
    first = True
    for layer in cfg["model"]["layers"]:
        t = layer["type"]
        if t == "conv2d":
            kh, kw = _pair(layer.get("kernel"), 3)
            sh, sw = _pair(layer.get("strides", layer.get("stride")), 1)
            if layer.get("padding", "valid") == "same":
                oh, ow = -(-h // sh), -(-w // sw)
            else:
                oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
            k = int(layer["filters"])
            f = 2 * oh * ow * k * kh * kw * c
            fwd += f
            bwd += f if first else 2 * f
            h, w, c = oh, ow, k
        elif t in ("max_pool", "avg_pool"):
            ph, pw = _pair(layer.get("pool_size", layer.get("size")), 2)
            given = layer.get("strides", layer.get("stride"))
            sh, sw = _pair(given, 1) if given is not None else (ph, pw)
            if layer.get("padding", "valid") == "same":
                h, w = -(-h // sh), -(-w // sw)
            else:
                h, w = (h - ph) // sh + 1, (w - pw) // sw + 1
        elif t in ("global_avg_pool", "flatten", "dense"):
            break  # no convolution after these in a plain stack
        elif t == "residual":
            return None
        first = False
    return fwd, bwd


def safetensors_shapes(path):
    """name -> shape from a .safetensors file's header (no tensor data read)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def compare_shapes(mpx, peer):
    """'' when the two name -> shape maps agree, else a short list of the differences."""
    diffs = [f"{k}: mpx {mpx.get(k)}, peer {peer.get(k)}" for k in sorted(set(mpx) | set(peer))
             if mpx.get(k) != peer.get(k)]
    return "; ".join(diffs[:4]) + (f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else "")


_VERBOSE_INFO = re.compile(r"onednn_verbose,(?:[^,]*,)*?info,(oneDNN v[0-9.]+[^\n]*)")
_VERBOSE_ISA = re.compile(r"onednn_verbose,(?:[^,]*,)*?info,cpu,isa:([^\n]*)")


def onednn_summary(text):
    """From ONEDNN_VERBOSE=1 output: the oneDNN version line, the ISA line, and the
    implementations that executed per primitive kind and propagation ('convolution
    brgconv:avx512_core backward_weights', ...)."""
    version = _VERBOSE_INFO.search(text)
    isa = _VERBOSE_ISA.search(text)
    impls = {}
    for line in text.splitlines():
        if not line.startswith("onednn_verbose") or ",exec," not in line:
            continue
        parts = line.split(",")
        i = parts.index("exec")
        if i + 4 >= len(parts) or parts[i + 1] != "cpu":
            continue
        kind, impl, prop = parts[i + 2], parts[i + 3], parts[i + 4]
        if kind in ("convolution", "inner_product", "matmul", "deconvolution"):
            impls[f"{kind} {impl} {prop}"] = impls.get(f"{kind} {impl} {prop}", 0) + 1
    return {"version": version.group(1).strip() if version else None,
            "isa": isa.group(1).strip() if isa else None,
            "kernels": sorted(impls)}


def last_json(stdout):
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else None


def run_json(cmd, env, timeout, cwd=None):
    """Runs cmd; returns (its last JSON line or None, an error text or None, stdout + stderr)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s", ""
    out = p.stdout + p.stderr
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {out.strip()[-300:]}", out
    r = last_json(p.stdout)
    return (r, None, out) if r is not None else (None, "no JSON on stdout", out)
