#!/bin/sh
# SPDX-License-Identifier: MIT
# Creates the virtual environment of the PyTorch peer (bench/torch_peer.py,
# bench/cpu_peers.sh; docs/cpu-performance.md, "Against the peers") OUTSIDE the
# repository. Not a dependency of mpx: nothing in the build or the tests needs it.
#
# The x86_64 Linux torch wheels on PyPI depend on the CUDA runtime wheels
# (nvidia-*, several GB); the CPU-only index of the PyTorch project is not
# always reachable, so the default is plain PyPI. Set MPX_TORCH_INDEX to a
# CPU-only index URL to get the small wheel where that index is reachable.
# MPX_TORCH_SYSTEM=1 instead makes a venv over the system's packages (Debian:
# python3-torch, an older release; with PYTHON=/usr/bin/python3 where another
# python3 comes first on PATH) for machines without PyPI.
# Usage: bench/torch_setup.sh   (MPX_PEER_VENV overrides the folder)
set -eu
VENV="${MPX_PEER_VENV:-$HOME/.cache/mpx-peers/torch}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  if [ "${MPX_TORCH_SYSTEM:-0}" = 1 ]; then
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
if [ "${MPX_TORCH_SYSTEM:-0}" != 1 ]; then
  if [ -n "${MPX_TORCH_INDEX:-}" ]; then
    "$VENV/bin/pip" install -q --index-url "$MPX_TORCH_INDEX" torch
  else
    "$VENV/bin/pip" install -q torch
  fi
  "$VENV/bin/pip" install -q numpy pyyaml
fi
if ! "$VENV/bin/python" -c 'import torch, numpy, yaml; print("torch", torch.__version__, "mkldnn", torch.backends.mkldnn.is_available())'; then
  echo "torch_setup.sh: $VENV cannot import torch, numpy and yaml (MPX_TORCH_SYSTEM=1 needs python3-torch, python3-numpy and python3-yaml)" >&2
  exit 1
fi
echo "run the peer with: $VENV/bin/python bench/torch_peer.py --help"
