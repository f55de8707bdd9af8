#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""GEMM GFLOP/s of numpy (its BLAS, OpenBLAS in the PyPI wheels) or of torch
(MKL / oneDNN), for bench/cpu_peers.py beside oneDNN's (bench/gemm_ceiling).
float32, or bfloat16 with torch (oneDNN's AMX / AVX512-BF16 kernels where the CPU has them).
    python bench/peers_gemm.py --lib numpy|torch [--dtype float32|bfloat16] [--n 2048] [--threads 2] [--reps 6]
Prints one JSON object. numpy's BLAS takes its thread count from the environment
(OMP_NUM_THREADS / OPENBLAS_NUM_THREADS), which the driver sets."""
import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", choices=["numpy", "torch"], required=True)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=6)
    a = ap.parse_args()
    if a.dtype == "bfloat16" and a.lib != "torch":
        ap.error("--dtype bfloat16 needs --lib torch")
    if a.lib == "torch":
        import torch as t
        t.set_num_threads(a.threads)
        dt = t.bfloat16 if a.dtype == "bfloat16" else t.float32
        x, y = t.rand(a.n, a.n).to(dt), t.rand(a.n, a.n).to(dt)
    else:
        import numpy as t
        rng = t.random.default_rng(0)
        x, y = rng.random((a.n, a.n), dtype=t.float32), rng.random((a.n, a.n), dtype=t.float32)
    g = []
    for _ in range(a.reps + 1):  # the first is a warm-up
        s = time.perf_counter()
        z = x @ y
        g.append(2 * a.n ** 3 / (time.perf_counter() - s) / 1e9)
    print(json.dumps({"gemm": f"{a.lib} {t.__version__} {a.dtype} matmul", "dtype": a.dtype, "n": a.n, "gflops_best": max(g[1:]),
                      "gflops_median": sorted(g[1:])[len(g) // 2 - 1], "checksum": float(z[1, 1].item() if a.lib == "torch" else z[1, 1])}))


if __name__ == "__main__":
    main()
