#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The error of Winograd convolutions whose products are taken in bfloat16.

A Winograd convolution multiplies transformed tiles (V = B^T d B) by transformed
filters (U = G g G^T). With a bfloat16 product both are rounded to bfloat16
(8 significant bits) before the multiply, which the direct convolution of
bfloat16 operands never does: its products are exact in float32. This script
measures what that rounding costs against a float64 direct convolution, for
F(4x4,3x3) and F(2x2,3x3), on bfloat16 activations shaped like the fast CIFAR
recipe's (GELU of a unit normal, the output of batch norm then GELU) and
He-normal filters, beside the float32 product and beside rounding the exact
output to bfloat16 once (what any bfloat16 layer does). It decides whether mpx's
Winograd kernels may take a bfloat16 product (docs/cpu-performance.md,
"bfloat16 products in the Winograd domain").

    python3 bench/winograd_bf16_error.py [--tiles N] [--seed S]

Needs numpy only (the PyTorch peer's venv has it).
"""
import argparse
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("winograd_bf16_error.py: needs numpy (pip install numpy, or run it in the venv of bench/torch_setup.sh)")

BT4 = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)
G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
AT4 = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], float)
BT2 = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)
G2 = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
AT2 = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)


def bf16(a):
    """a rounded to the nearest bfloat16 (ties to even), as float64."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def gelu(z):
    return z * 0.5 * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))


def rel(e, y):
    return np.sqrt((e ** 2).mean() / (y ** 2).mean()), np.abs(e).max() / np.sqrt((y ** 2).mean())


def run(rng, m, C, K, tiles):
    BT, G, AT = (BT4, G4, AT4) if m == 4 else (BT2, G2, AT2)
    A = m + 2
    x = bf16(gelu(rng.standard_normal((tiles, A, A, C))))
    w = bf16(rng.standard_normal((K, 3, 3, C)) * np.sqrt(2 / (9 * C)))
    y = np.zeros((tiles, m, m, K))
    for p in range(m):
        for q in range(m):
            y[:, p, q, :] = np.einsum('trsc,krsc->tk', x[:, p:p + 3, q:q + 3, :], w)
    V = np.einsum('ak,tklc,bl->tabc', BT, x, BT)
    U = np.einsum('ar,krsc,bs->abck', G, w, G)
    rows = []
    for name, rnd in (('V, U rounded to float32', f32), ('V, U rounded to bfloat16', bf16)):
        M = np.einsum('tabc,abck->tabk', rnd(V), rnd(U))
        rows.append((name, *rel(np.einsum('pa,tabk,qb->tpqk', AT, M, AT) - y, y)))
    rows.append(('exact output rounded to bfloat16', *rel(bf16(y) - y, y)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--tiles', type=int, default=200, help='output tiles per case (default 200)')
    ap.add_argument('--seed', type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(f'relative error against the float64 direct convolution, {a.tiles} tiles, K = 64, seed {a.seed}')
    print(f'{"tile":10} {"C":>4}  {"what (sums in float64)":34} {"rms / rms(y)":>13} {"max / rms(y)":>13}')
    for m in (4, 2):
        for C in (64, 256):
            for name, r, mx in run(rng, m, C, 64, a.tiles):
                print(f'F({m}x{m},3x3) {C:>4}  {name:34} {r:13.2e} {mx:13.2e}')


if __name__ == '__main__':
    main()
