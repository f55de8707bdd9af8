#!/bin/sh
# SPDX-License-Identifier: MIT
# Regenerates tests/fixtures/keras_parity/ (docs/keras-parity.md) from the committed initial
# weights (*.init.safetensors, kept where present): a tiny MNIST-format data
# set (the first 160 training and 16 test images of MNIST, 2x2-averaged to 14x14), then the
# harness's Keras reference for the tiny net under each policy and loss-scale scenario.
# Needs the venv of bench/keras_setup.sh, the built mpx and MNIST (MPX_DATA_MIRROR or ../shared/data).
# Usage: bench/keras_parity_fixtures.sh   (from the repository root)
set -eu
VENV="${MPX_PEER_VENV:-$HOME/.cache/mpx-peers/keras}"
PY="$VENV/bin/python"
FIX=tests/fixtures/keras_parity
MNIST="${MPX_DATA_MIRROR:-../shared/data}/mnist"
mkdir -p "$FIX/data"
"$PY" - "$MNIST" "$FIX/data" <<'PYEOF'
import gzip, os, struct, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
def read(name):
    p = os.path.join(src, name)
    return open(p, "rb").read() if os.path.exists(p) else gzip.open(p + ".gz").read()
for split, n in (("train", 160), ("t10k", 16)):
    img, lab = read(f"{split}-images-idx3-ubyte"), read(f"{split}-labels-idx1-ubyte")
    x = np.frombuffer(img, np.uint8, n * 784, 16).reshape(n, 14, 2, 14, 2).astype(np.float32)
    x = np.floor(x.mean(axis=(2, 4)) + 0.5).astype(np.uint8)
    with open(os.path.join(dst, f"{split}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 14, 14) + x.tobytes())
    with open(os.path.join(dst, f"{split}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + lab[8:8 + n])
PYEOF
run() { "$PY" bench/keras_parity.py --config "$FIX/net.yaml" --data "$FIX/data" --batch 8 --threads 1 \
          --fixture "$FIX" --init-dir "$FIX" "$@"; }
run --steps 20 --policies float32,mixed_bfloat16
# float16: a huge initial scale (overflows, backoff), growth every 3 good steps, one injected inf
run --steps 20 --policies mixed_float16 --scale-initial 16777216 --growth-interval 3 --inject-inf 14 \
    --fixture-name mixed_float16_overflow
# float16: the floor at 1 (an inf at scale 1 keeps 1), then growth every 2 good steps
run --steps 12 --policies mixed_float16 --scale-initial 1 --growth-interval 2 --inject-inf 2 \
    --fixture-name mixed_float16_floor
