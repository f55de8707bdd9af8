#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prepares what a GPU lease carries (docs/gpu.md "The staged GPU check"): builds
# build-gpu (the cuda preset, Hopper only: CMAKE_CUDA_ARCHITECTURES=90), then
# assembles the lean folder gpu-bundle/ that the device call carries:
#   app/mpx, tests/mpx_cuda_tests   stripped
#   lib/<soname>.xz                 the shared libraries the binaries load that a base
#                                   image with CUDA and PyTorch lacks (yaml-cpp, spdlog,
#                                   fmt, whatever libdnnl the build links, ...), found
#                                   with ldd and xz-compressed (gpu_check.sh unpacks them)
#   deps.tar.xz                     the fallback's prefix: headers, CMake package files
#                                   and link names of the non-CUDA build dependencies
#                                   (scripts/gpu_fallback_build.sh builds mpx there from
#                                   the carried working tree against it)
# No data: the GPU trainings use synthetic data. Fails when the folder is over LIMIT_MIB.
#
#   scripts/gpu_bundle.sh                 then on the device:
#   run(command="scripts/gpu_check.sh probe tests", carry=["gpu-bundle"])
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
BUNDLE=${BUNDLE:-gpu-bundle}
JOBS=${JOBS:-$(nproc)}
LIMIT_MIB=${LIMIT_MIB:-40}  # the carry limit is 64 MiB with the working tree

args=(--preset cuda -B "$BUILD_DIR" -DCMAKE_CUDA_ARCHITECTURES=90)
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
fi
echo "== configure $BUILD_DIR"
cmake "${args[@]}" >/dev/null
echo "== build mpx and mpx_cuda_tests (-j$JOBS)"
cmake --build "$BUILD_DIR" --target mpx mpx_cuda_tests -j"$JOBS"

bins=("$BUILD_DIR/app/mpx" "$BUILD_DIR/tests/mpx_cuda_tests")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "gpu_bundle: $b was not built" >&2; exit 1; }
done

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/app" "$BUNDLE/tests" "$BUNDLE/lib"
strip --strip-unneeded -o "$BUNDLE/app/mpx" "$BUILD_DIR/app/mpx"
strip --strip-unneeded -o "$BUNDLE/tests/mpx_cuda_tests" "$BUILD_DIR/tests/mpx_cuda_tests"

# What every Ubuntu/Debian image with a C++ runtime has, and CUDA's own libraries (the
# device image has the CUDA 13 toolkit; cuDNN, cuBLAS and NCCL come from its PyTorch wheels).
# libstdc++ stays too: a carried older one would be loaded by PyTorch as well.
is_system() {
  case "$(basename "$1")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) return 0 ;;
    libz.so* | linux-vdso*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas*.so* | libcudnn*.so* | libnccl*.so* | libnvrtc*.so* | libcurand*.so*) return 0 ;;
  esac
  return 1
}

echo "== shared libraries to carry (from ldd of the binaries)"
links=()  # "realname soname" pairs for the fallback prefix
while read -r lib; do
  case "$lib" in /usr/lib/* | /lib/*) ;; *) continue ;; esac
  is_system "$lib" && continue
  so=$(basename "$lib")
  real=$(basename "$(readlink -f "$lib")")
  xz -T0 -6 -c "$lib" >"$BUNDLE/lib/$so.xz"
  [[ $real != "$so" ]] && links+=("$real $so")
  echo "  $so ($(du -hL "$lib" | cut -f1), $(du -h "$BUNDLE/lib/$so.xz" | cut -f1) compressed)"
done < <(for b in "${bins[@]}"; do ldd "$b" | awk '/=> \// {print $3}'; done | sort -u)

echo "== fallback prefix (headers and CMake files of the non-CUDA build dependencies)"
PREFIX=$(mktemp -d /tmp/mpx-deps.XXXXXX)
DEV_PKGS=${DEV_PKGS:-"libfmt-dev libspdlog-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev catch2 zlib1g-dev"}
dnnl_dev=$(dpkg -S "$(find /usr/include -maxdepth 1 -name dnnl.hpp | head -1)" 2>/dev/null | cut -d: -f1 | head -1 || true)
for pkg in $DEV_PKGS $dnnl_dev; do
  dpkg -L "$pkg" 2>/dev/null | while read -r f; do
    case "$f" in
      /usr/include/* | */cmake/* | */pkgconfig/*) ;;
      /usr/lib/*.so | /usr/lib/*.a) ;;  # link names; Catch2's main library is static
      *) continue ;;
    esac
    [[ -f $f || -L $f ]] || continue
    mkdir -p "$PREFIX$(dirname "$f")"
    cp -P "$f" "$PREFIX$f"
  done
done
libdir="$PREFIX/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
mkdir -p "$libdir"
for pair in "${links[@]}"; do
  read -r real so <<<"$pair"
  ln -sf "$so" "$libdir/$real"  # CMake package files name the real file; the carried one is the soname
done
# zlib's link name points at the image's own runtime library.
[[ -L $libdir/libz.so ]] && ln -sf /lib/x86_64-linux-gnu/libz.so.1 "$libdir/libz.so"
tar -C "$PREFIX" -cJf "$BUNDLE/deps.tar.xz" usr
rm -rf "$PREFIX"

size_kib=$(du -sk "$BUNDLE" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "== $BUNDLE: ${size_kib} KiB ($((size_kib / 1024)) MiB); tracked working tree: ${tree_kib} KiB"
du -ak "$BUNDLE" | sort -rn | head -8
if ((size_kib / 1024 > LIMIT_MIB)); then
  echo "gpu_bundle: $BUNDLE is over ${LIMIT_MIB} MiB; the device carry limit is 64 MiB with the tree" >&2
  exit 1
fi
echo "gpu_bundle: ready. On the device: scripts/gpu_check.sh probe tests train (carry: $BUNDLE)"
