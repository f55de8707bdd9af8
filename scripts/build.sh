#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Configures and builds mpx in Release (build/ by default). Extra CMake
# arguments: MPX_CMAKE_ARGS="-DMPX_CUDA=OFF ...". Uses ccache when installed.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
args=(-DCMAKE_BUILD_TYPE=Release)
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2206
args+=(${MPX_CMAKE_ARGS:-})

cmake -S . -B "$BUILD_DIR" "${args[@]}"
cmake --build "$BUILD_DIR" -j"$(nproc)"
