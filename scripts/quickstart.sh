#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Everything from a fresh Debian/Ubuntu machine to a trained MNIST model:
# installs the packages, builds the mpx binary (not the tests), fetches MNIST (from the official host, or
# from a local copy named by MPX_DATA_MIRROR) and trains configs/mnist_smoke.yaml.
# Extra arguments go to `mpx train` (e.g. --set optimizer.learning_rate=3e-3).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
MPX_BUILD_TARGET=mpx scripts/build.sh  # the binary only; scripts/test.sh builds the tests too
data_scripts/get_mnist.sh
exec "${BUILD_DIR:-build}/app/mpx" train --config configs/mnist_smoke.yaml "$@"
