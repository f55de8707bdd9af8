#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prepares what a GPU lease carries (docs/gpu.md "The staged GPU check"): builds
# build-gpu (the cuda preset, Hopper only: CMAKE_CUDA_ARCHITECTURES=90), then
# assembles the lean folder gpu-bundle/ that the device call carries:
#   app/mpx, tests/mpx_cuda_tests   stripped
#   lib/<soname>.xz                 every shared library the binaries load from outside the
#                                   C/C++ runtime and CUDA (oneDNN from its prefix, yaml-cpp,
#                                   spdlog, fmt, libgomp, Open MPI, ...), whatever its folder,
#                                   found with ldd and xz-compressed (gpu_check.sh unpacks them)
#   deps.tar.xz                     the fallback's prefix: headers, CMake package files and link
#                                   names of the non-CUDA build dependencies, the oneDNN the
#                                   build used among them (scripts/gpu_fallback_build.sh builds
#                                   mpx there from the carried working tree against it)
# No data: the GPU trainings use synthetic data. Fails when the folder is over LIMIT_MIB.
# MPX_BUNDLE_FROM=DIR assembles from an existing build instead (the bare-root test does that
# with the Release build, docs/gpu.md "A bare machine here").
#
#   scripts/gpu_bundle.sh                 then on the device:
#   run(command="MPX_CALL_BUDGET_S=300 scripts/gpu_check.sh probe tests", carry=["gpu-bundle"], timeout_s=330)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
BUNDLE=${BUNDLE:-gpu-bundle}
JOBS=${JOBS:-$(nproc)}
LIMIT_MIB=${LIMIT_MIB:-40}  # the carry limit is 64 MiB with the working tree

if [[ -n ${MPX_BUNDLE_FROM:-} ]]; then
  BUILD_DIR=$MPX_BUNDLE_FROM
  echo "== assembling from the existing build $BUILD_DIR (MPX_BUNDLE_FROM)"
else
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
fi

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
# libstdc++ stays too: a carried older one would be loaded by PyTorch as well. Everything
# else is carried, whichever folder ldd found it in (/usr/lib, /opt/mpx-deps, ...).
is_system() {
  case "$(basename "$1")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) return 0 ;;
    libz.so* | linux-vdso*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas*.so* | libcudnn*.so* | libnccl*.so* | libnvrtc*.so* | libcurand*.so*) return 0 ;;
  esac
  case "$1" in
    /usr/local/cuda* | */site-packages/nvidia/*) return 0 ;;
  esac
  return 1
}

echo "== shared libraries to carry (from ldd of the binaries)"
links=()      # "realname soname" pairs for the fallback prefix
dnnl_lib=""   # the oneDNN the binaries load
while read -r lib; do
  is_system "$lib" && continue
  so=$(basename "$lib")
  real=$(basename "$(readlink -f "$lib")")
  xz -T0 -6 -c "$lib" >"$BUNDLE/lib/$so.xz"
  [[ $real != "$so" ]] && links+=("$real $so")
  [[ $so == libdnnl.so* ]] && dnnl_lib=$lib
  echo "  $so from $(dirname "$lib") ($(du -hL "$lib" | cut -f1), $(du -h "$BUNDLE/lib/$so.xz" | cut -f1) compressed)"
done < <(for b in "${bins[@]}"; do ldd "$b" | awk '/=> \// {print $3}'; done | sort -u)
missing=$(for b in "${bins[@]}"; do ldd "$b"; done | grep "not found" | sort -u || true)
if [[ -n $missing ]]; then
  echo "gpu_bundle: ldd finds no file for: $missing" >&2
  exit 1
fi

echo "== fallback prefix (headers and CMake files of the non-CUDA build dependencies)"
PREFIX=$(mktemp -d /tmp/mpx-deps.XXXXXX)
DEV_PKGS=${DEV_PKGS:-"libfmt-dev libspdlog-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev catch2 zlib1g-dev"}
dnnl_dev=""
dnnl_prefix=""
if [[ -n $dnnl_lib && $(readlink -f "$dnnl_lib") != /usr/lib/* && $(readlink -f "$dnnl_lib") != /lib/* ]]; then
  # oneDNN from a prefix of its own (scripts/install_onednn.sh): its headers and CMake files,
  # with link names to the carried soname, under onednn/ in the prefix.
  dnnl_prefix=$(dirname "$(dirname "$(readlink -f "$dnnl_lib")")")
  mkdir -p "$PREFIX/onednn/lib"
  cp -a "$dnnl_prefix/include" "$PREFIX/onednn/"
  cp -a "$dnnl_prefix/lib/cmake" "$PREFIX/onednn/lib/"
  dnnl_so=$(basename "$dnnl_lib")
  for f in "$dnnl_prefix"/lib/libdnnl.so*; do
    [[ $(basename "$f") == "$dnnl_so" ]] && continue
    ln -sf "$dnnl_so" "$PREFIX/onednn/lib/$(basename "$f")"
  done
  echo "  oneDNN from $dnnl_prefix (headers, CMake files; $dnnl_so is carried in lib/)"
else
  dnnl_dev=$(dpkg -S "$(find /usr/include -maxdepth 1 -name dnnl.hpp | head -1)" 2>/dev/null | cut -d: -f1 | head -1 || true)
fi
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
  [[ $so == libdnnl.so* && -n $dnnl_prefix ]] && continue
  ln -sf "$so" "$libdir/$real"  # CMake package files name the real file; the carried one is the soname
done
# zlib's link name points at the image's own runtime library.
[[ -L $libdir/libz.so ]] && ln -sf /lib/x86_64-linux-gnu/libz.so.1 "$libdir/libz.so"
mapfile -t top < <(cd "$PREFIX" && ls)  # usr/, and onednn/ when oneDNN came from a prefix
tar -C "$PREFIX" -cJf "$BUNDLE/deps.tar.xz" "${top[@]}"
rm -rf "$PREFIX"

size_kib=$(du -sk "$BUNDLE" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "== $BUNDLE: ${size_kib} KiB ($((size_kib / 1024)) MiB); tracked working tree: ${tree_kib} KiB"
du -ak "$BUNDLE" | sort -rn | head -8
if ((size_kib / 1024 > LIMIT_MIB)); then
  echo "gpu_bundle: $BUNDLE is over ${LIMIT_MIB} MiB; the device carry limit is 64 MiB with the tree" >&2
  exit 1
fi
echo "gpu_bundle: ready. On the device (carry: $BUNDLE): call 1 MPX_CALL_BUDGET_S=300 scripts/gpu_check.sh probe tests; call 2 MPX_CALL_BUDGET_S=270 scripts/gpu_check.sh train bench (docs/gpu.md)"
