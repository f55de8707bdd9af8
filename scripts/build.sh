#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Configures and builds mpx with a CMake preset (CMakePresets.json; default
# `release`: Release, CUDA when found) into build/ (BUILD_DIR overrides the
# preset's folder). Extra CMake arguments: MPX_CMAKE_ARGS="-DMPX_CUDA=OFF ...";
# another preset: MPX_PRESET=cpu-only. MPX_BUILD_TARGET=mpx builds that target only
# (quickstart.sh: the binary, not the tests and benchmarks). Uses ccache when installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PRESET=${MPX_PRESET:-release}
BUILD_DIR=${BUILD_DIR:-}
if [[ -z $BUILD_DIR && $PRESET == release ]]; then BUILD_DIR=build; fi
args=(--preset "$PRESET")
[[ -n $BUILD_DIR ]] && args+=(-B "$BUILD_DIR")
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# CMake finds nvcc through CUDACXX, CUDAToolkit_ROOT or PATH; the toolkit's usual
# home is a hint only when none of them names one.
if [[ -z ${CUDACXX:-} && -z ${CUDAToolkit_ROOT:-} ]] && ! command -v nvcc >/dev/null 2>&1 &&
   [[ -x /usr/local/cuda/bin/nvcc ]]; then
  args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
fi
# shellcheck disable=SC2206
args+=(${MPX_CMAKE_ARGS:-})

cmake "${args[@]}"
target=()
[[ -n ${MPX_BUILD_TARGET:-} ]] && target=(--target "$MPX_BUILD_TARGET")
if [[ -n $BUILD_DIR ]]; then
  cmake --build "$BUILD_DIR" -j"$(nproc)" "${target[@]}"
else
  cmake --build --preset "$PRESET" -j"$(nproc)" "${target[@]}"
fi
