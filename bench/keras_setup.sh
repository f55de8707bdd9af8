#!/bin/sh
# SPDX-License-Identifier: MIT
# Creates the virtual environment of the Keras parity harness (bench/keras_parity.py,
# docs/keras-parity.md) OUTSIDE the repository: tensorflow-cpu and tf-keras 2.x, with
# the safetensors, numpy and pyyaml packages the harness reads and writes with.
# Not a dependency of mpx. Usage: bench/keras_setup.sh  (MPX_PEER_VENV overrides the folder)
set -eu
VENV="${MPX_PEER_VENV:-$HOME/.cache/mpx-peers/keras}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
fi
# tf-keras must have the same minor version as tensorflow; pip resolves the pair.
"$VENV/bin/pip" install -q 'tensorflow-cpu>=2.16,<2.21' 'tf-keras>=2.16,<2.21' safetensors numpy pyyaml
TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -c \
  'import tensorflow as tf, tf_keras; print("tensorflow", tf.__version__, "tf-keras", tf_keras.__version__)'
echo "run the harness with: $VENV/bin/python bench/keras_parity.py --help"
