#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Set-up and the whole test suite: installs the Debian packages, builds in
# Release and runs every test with CTest. Tests read the real data sets from
# ../shared/data (or MPX_DATA_MIRROR); CUDA tests report themselves skipped
# where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
export MPX_DATA_MIRROR=${MPX_DATA_MIRROR:-$(cd .. && pwd)/shared/data}
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 -j"$(nproc)"
