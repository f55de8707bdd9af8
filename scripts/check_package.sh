#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the Debian package of a CPU-only mpx (cpack -G DEB), installs it with
# dpkg -i on this machine, checks that the installed binary runs
# (`mpx --version` is the package's version; `mpx validate` accepts the
# installed smoke config) and removes the package again (dpkg -r).
#
#   scripts/check_package.sh [--keep]      (--keep: leave the package installed)
#
# Needs root or sudo, dpkg-dev (dpkg-shlibdeps) and the build dependencies of
# scripts/install_deps.sh. Refuses to run where an mpx package or an unpackaged
# /usr/bin/mpx is already installed. PKG_BUILD_DIR (default build-pkg) is the
# build folder; JOBS (default: nproc) the build parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."

KEEP=0
for a in "$@"; do
  case "$a" in
    --keep) KEEP=1 ;;
    *) echo "usage: scripts/check_package.sh [--keep]" >&2; exit 2 ;;
  esac
done

BUILD_DIR=${PKG_BUILD_DIR:-build-pkg}
JOBS=${JOBS:-$(nproc)}
say() { echo "== check_package: $*"; }
fail() { echo "check_package: FAILED: $*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || fail "not root and no sudo: dpkg -i needs one of them"
  SUDO="sudo"
fi
for tool in dpkg dpkg-deb dpkg-shlibdeps cpack; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found (apt-get install dpkg-dev cmake)"
done
if dpkg-query -W -f='${Status}' mpx 2>/dev/null | grep -q "install ok installed"; then
  fail "an mpx package is already installed; remove it first (dpkg -r mpx)"
fi
[[ -e /usr/bin/mpx ]] && fail "/usr/bin/mpx exists and belongs to no mpx package; move it away first"

say "configure $BUILD_DIR (preset cpu-only, Debian's oneDNN, no tests, no benchmarks)"
# The package depends on Debian's oneDNN (libdnnl2), not on the prefix of scripts/install_onednn.sh.
args=(--preset cpu-only -B "$BUILD_DIR" -DMPX_BUILD_TESTS=OFF -DMPX_BUILD_BENCH=OFF -DMPX_ONEDNN=SYSTEM)
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake "${args[@]}" >/dev/null
say "build (-j$JOBS)"
cmake --build "$BUILD_DIR" -j"$JOBS" >/dev/null

say "cpack -G DEB"
rm -f "$BUILD_DIR"/mpx_*.deb
(cd "$BUILD_DIR" && cpack -G DEB >/dev/null)
deb=$(ls "$BUILD_DIR"/mpx_*.deb 2>/dev/null | head -1)
[[ -n $deb ]] || fail "cpack wrote no mpx_*.deb into $BUILD_DIR"
version=$(dpkg-deb -f "$deb" Version)
depends=$(dpkg-deb -f "$deb" Depends)
echo "package: $deb"
echo "version: $version"
echo "depends: $depends"
for lib in libyaml-cpp libspdlog libfmt libdnnl zlib1g libgomp1; do
  [[ $depends == *"$lib"* ]] || fail "Depends lacks $lib"
done
if grep -q '#define MPX_WITH_MPI 1' "$BUILD_DIR/generated/mpx/config.hpp"; then
  [[ $depends == *libopenmpi* ]] || fail "built with MPI but Depends lacks libopenmpi"
fi

installed=0
cleanup() {
  if [[ $installed -eq 1 && $KEEP -eq 0 ]]; then
    say "dpkg -r mpx"
    $SUDO dpkg -r mpx >/dev/null
  fi
}
trap cleanup EXIT

say "dpkg -i $deb"
$SUDO dpkg -i "$deb"
installed=1

say "installed files"
dpkg -L mpx | grep -E '^/usr/(bin/mpx|share/mpx/configs/mnist_smoke.yaml|share/doc/mpx/README.md)$' || true
[[ -x /usr/bin/mpx ]] || fail "/usr/bin/mpx is not installed"
[[ -f /usr/share/mpx/configs/mnist_smoke.yaml ]] || fail "/usr/share/mpx/configs/mnist_smoke.yaml is not installed"

tmp=$(mktemp -d)
say "mpx --version"
got=$(cd "$tmp" && /usr/bin/mpx --version)
echo "$got"
[[ $got == "mpx $version" ]] || fail "mpx --version printed '$got', expected 'mpx $version'"

say "mpx validate --config /usr/share/mpx/configs/mnist_smoke.yaml"
if ! (cd "$tmp" && /usr/bin/mpx validate --config /usr/share/mpx/configs/mnist_smoke.yaml); then
  rm -rf "$tmp"
  fail "mpx validate exited non-zero"
fi
rm -rf "$tmp"

say "passed ($deb)"
