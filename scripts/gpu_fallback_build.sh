#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The fallback of the staged GPU check (docs/gpu.md): where the carried mpx does
# not start on the GPU machine, configure and build mpx and mpx_cuda_tests there,
# from the carried working tree, with that machine's CMake, nvcc and CUDA toolkit,
# against the carried prefix of the non-CUDA dependencies (gpu-bundle/deps.tar.xz:
# headers and CMake files; their libraries are gpu-bundle/lib, unpacked by
# gpu_check.sh) and the cuDNN / NCCL of PyTorch's wheels. MPI (and so NCCL) is off.
# oneDNN is the one the bundle's build used: from the prefix's onednn/ (its headers and
# CMake files) with the carried libdnnl, else Debian's headers in the prefix's usr/.
#
#   scripts/gpu_fallback_build.sh [BUNDLE] [BUILD_DIR]   (gpu-bundle, build-gpu-local)
#   then, in the same device call: scripts/gpu_check.sh --build build-gpu-local probe tests
# FALLBACK_CONFIGURE_ONLY=1 stops after the configure step (the bare-root test, docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_check_lib.sh

BUNDLE=${1:-gpu-bundle}
OUT_BUILD=${2:-build-gpu-local}
DEPS=${FALLBACK_DEPS_DIR:-/tmp/mpx-deps}
[[ -f $BUNDLE/deps.tar.xz ]] || { echo "gpu_fallback_build: $BUNDLE/deps.tar.xz is missing (scripts/gpu_bundle.sh)" >&2; exit 1; }
rm -rf "$DEPS"
mkdir -p "$DEPS"
if command -v xz >/dev/null 2>&1; then
  tar -C "$DEPS" -xJf "$BUNDLE/deps.tar.xz"
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE/deps.tar.xz" "$DEPS"
fi
libs=$(unpack_libs "$BUNDLE")
multi=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
mkdir -p "$DEPS/usr/lib/$multi"
cp -f "$libs"/* "$DEPS/usr/lib/$multi/"  # the link names in the prefix point at these
onednn=()
if [[ -d $DEPS/onednn ]]; then
  cp -f "$libs"/libdnnl.so* "$DEPS/onednn/lib/"
  onednn=(-DMPX_ONEDNN=PREFIX -DMPX_ONEDNN_PREFIX="$DEPS/onednn")
  echo "oneDNN from the carried prefix: $(cd "$DEPS/onednn/lib" && echo libdnnl.so*)"
fi
rm -rf "$libs"

# cuDNN and NCCL: the CUDA toolkit's when it has them, else PyTorch's wheels (headers and
# libraries without the unversioned link names CMake looks for).
extra=()
if ! ls /usr/local/cuda/lib64/libcudnn.so >/dev/null 2>&1; then
  wheel=$(python3 -c 'import os, nvidia.cudnn as m; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null || true)
  if [[ -n $wheel && -f $wheel/include/cudnn.h ]]; then
    lib=$(find "$wheel/lib" -maxdepth 1 -name 'libcudnn.so.*' | sort | head -1)
    extra+=(-DCUDNN_INCLUDE_DIR="$wheel/include" -DCUDNN_LIBRARY="$lib")
    echo "cuDNN from PyTorch's wheel: $lib"
  fi
fi
nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
echo "== configure $OUT_BUILD with $(cmake --version | head -1), nvcc at $nvcc_path"
cmake -S . -B "$OUT_BUILD" -DCMAKE_BUILD_TYPE=Release -DMPX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_PREFIX_PATH="$DEPS/usr" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
  -DMPX_BUILD_BENCH=OFF -DMPX_TEST_DATA_DIR=/nonexistent "${onednn[@]}" "${extra[@]}"
if [[ ${FALLBACK_CONFIGURE_ONLY:-0} == 1 ]]; then
  echo "gpu_fallback_build: configured $OUT_BUILD (FALLBACK_CONFIGURE_ONLY=1: not built)"
  exit 0
fi
echo "== build mpx and mpx_cuda_tests (-j$(nproc))"
read -r -a targets <<<"${FALLBACK_TARGETS:-mpx mpx_cuda_tests}"
cmake --build "$OUT_BUILD" --target "${targets[@]}" -j"$(nproc)"
echo "gpu_fallback_build: built $OUT_BUILD; next: scripts/gpu_check.sh --build $OUT_BUILD probe tests"
