#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prepares what a GPU lease carries (see scripts/gpu_check.sh): builds build-gpu
# with the cuda preset for Hopper only (-DCMAKE_CUDA_ARCHITECTURES=90), copies the non-system shared
# libraries the binaries need (yaml-cpp, spdlog, fmt, oneDNN, ...: what `ldd`
# resolves under /usr/lib or /lib that a base Ubuntu image with CUDA and PyTorch
# lacks) into build-gpu/lib, the MNIST mirror into build-gpu/data-mirror, strips
# what is not needed, and checks the size against the 64 MiB carry limit.
#
#   scripts/gpu_bundle.sh [build-dir]        (default build-gpu)
#   then on the device: run(command="scripts/gpu_check.sh", carry=["build-gpu"])
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${1:-build-gpu}
JOBS=${JOBS:-1}
LIMIT_MIB=${LIMIT_MIB:-60}   # leave room for the working tree in the 64 MiB carry
MIRROR=${MPX_DATA_MIRROR:-../shared/data}

args=(--preset cuda -B "$BUILD_DIR" -DCMAKE_CUDA_ARCHITECTURES=90)
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
echo "== configure $BUILD_DIR"
cmake "${args[@]}" >/dev/null
echo "== build mpx and mpx_cuda_tests (-j$JOBS)"
cmake --build "$BUILD_DIR" --target mpx mpx_cuda_tests -j"$JOBS"

bins=("$BUILD_DIR/app/mpx" "$BUILD_DIR/tests/mpx_cuda_tests")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "gpu_bundle: $b was not built" >&2; exit 1; }
done

# Libraries every Ubuntu/Debian base image with a C++ runtime has, and CUDA's own
# (the device image has the CUDA 13 toolkit; cuDNN comes from its PyTorch wheels).
is_system() {
  case "$(basename "$1")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++.so*|libgcc_s.so*|libz.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas*.so*|libcudnn*.so*|libnccl*.so*|libnvrtc*.so*|libcurand*.so*) return 0 ;;
    linux-vdso*) return 0 ;;
  esac
  return 1
}

mkdir -p "$BUILD_DIR/lib"
echo "== shared libraries to carry"
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$lib" in
    /usr/lib/*|/lib/*) ;;
    *) continue ;;
  esac
  if is_system "$lib"; then continue; fi
  cp -L "$lib" "$BUILD_DIR/lib/$(basename "$lib")"
  echo "  $(basename "$lib") ($(du -hL "$lib" | cut -f1))"
done

echo "== MNIST mirror"
if [[ -d $MIRROR/mnist ]]; then
  mkdir -p "$BUILD_DIR/data-mirror/mnist"
  cp "$MIRROR"/mnist/*.gz "$BUILD_DIR/data-mirror/mnist/"
  [[ -f $MIRROR/SHA256SUMS ]] && cp "$MIRROR/SHA256SUMS" "$BUILD_DIR/data-mirror/"
else
  echo "  no MNIST mirror at $MIRROR/mnist: gpu_check.sh will skip the MNIST epochs"
fi

# Only the binaries, the libraries and the data travel: drop objects and static libraries.
echo "== prune $BUILD_DIR (objects, static libraries, CMake internals)"
find "$BUILD_DIR" \( -name '*.o' -o -name '*.a' -o -name '*.d' \) -type f -delete
rm -rf "$BUILD_DIR/CMakeFiles" "$BUILD_DIR"/*/CMakeFiles "$BUILD_DIR"/*/*/CMakeFiles
strip --strip-unneeded "${bins[@]}" "$BUILD_DIR"/lib/*.so* 2>/dev/null || true

size_kib=$(du -sk "$BUILD_DIR" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "== $BUILD_DIR: $((size_kib / 1024)) MiB; tracked working tree: $((tree_kib / 1024)) MiB"
if (( size_kib / 1024 > LIMIT_MIB )); then
  echo "gpu_bundle: $BUILD_DIR is over ${LIMIT_MIB} MiB; the device carry limit is 64 MiB with the tree" >&2
  exit 1
fi
echo "gpu_bundle: ready. On the device: scripts/gpu_check.sh $BUILD_DIR (carry: $BUILD_DIR)"
