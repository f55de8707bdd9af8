#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs oneDNN 3.x (headers, libdnnl.so.3, CMake config) from Intel's official
# wheels on PyPI (onednn-cpu-gomp + onednn-devel-cpu-gomp: the GNU OpenMP build,
# the runtime mpx uses) into a prefix that CMake finds (MPX_ONEDNN_PREFIX,
# default /opt/mpx-deps/onednn; docs/cpu-performance.md). Called by
# scripts/install_deps.sh. Idempotent: a prefix that already holds this version
# is left alone.
#
# Never fails the set-up: where PyPI cannot be reached (or pip is missing and
# cannot be installed) it says so and exits 0, and the build falls back to
# Debian's libdnnl-dev (oneDNN 2.6), which CMake's configure step reports.
set -uo pipefail

# oneDNN 3.2 is Intel's 2023.2.0 release; the wheels are pinned by hash.
VERSION=2023.2.0
ONEDNN=3.2
HASH_LIB=2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb
HASH_DEV=9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284
PREFIX=${MPX_ONEDNN_PREFIX:-/opt/mpx-deps/onednn}
STAMP="$PREFIX/.mpx-onednn-version"

say() { echo "install_onednn.sh: $*"; }
fallback() {
  say "$*"
  say "oneDNN $ONEDNN NOT installed; the build falls back to Debian's libdnnl-dev (oneDNN 2.6)"
  exit 0
}

if [[ -f $STAMP && $(cat "$STAMP") == "$VERSION" && -e $PREFIX/lib/libdnnl.so.3 ]]; then
  say "oneDNN $ONEDNN ($VERSION) is installed in $PREFIX"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else fallback "not root and no sudo"; fi
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  say "installing python3-pip (to download the wheels)"
  # shellcheck disable=SC2015
  ( export DEBIAN_FRONTEND=noninteractive; $SUDO apt-get update -qq &&
    $SUDO apt-get install -y -qq --no-install-recommends python3-pip ) >/dev/null ||
    fallback "python3-pip could not be installed"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/req.txt" <<EOF
onednn-cpu-gomp==$VERSION --hash=sha256:$HASH_LIB
onednn-devel-cpu-gomp==$VERSION --hash=sha256:$HASH_DEV
EOF
say "downloading onednn-cpu-gomp and onednn-devel-cpu-gomp $VERSION from PyPI"
if ! timeout 900 python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
     --platform manylinux1_x86_64 --require-hashes --timeout 30 --retries 2 -r "$tmp/req.txt" -d "$tmp/wheels"; then
  fallback "pip could not download the wheels (is PyPI reachable?)"
fi

# A wheel is a zip file; the files to install are under <name>-<version>.data/data/.
mkdir -p "$tmp/x"
for whl in "$tmp"/wheels/*.whl; do
  python3 -m zipfile -e "$whl" "$tmp/x" || fallback "could not unpack $whl"
done
stage="$tmp/stage"
mkdir -p "$stage"
for d in "$tmp"/x/*.data/data; do cp -a "$d"/. "$stage"/; done
[[ -f $stage/include/oneapi/dnnl/dnnl.hpp && -f $stage/lib/libdnnl.so.$ONEDNN &&
   -f $stage/lib/cmake/dnnl/dnnl-config.cmake ]] || fallback "the wheels lack the expected files"
# Wheels cannot hold symbolic links: they carry three copies of the library. Keep one.
(cd "$stage/lib" && rm -f libdnnl.so libdnnl.so.3 && ln -s "libdnnl.so.$ONEDNN" libdnnl.so.3 &&
 ln -s libdnnl.so.3 libdnnl.so)
echo "$VERSION" >"$stage/.mpx-onednn-version"

$SUDO mkdir -p "$(dirname "$PREFIX")" || fallback "cannot create $(dirname "$PREFIX")"
$SUDO rm -rf "$PREFIX.new"
$SUDO cp -a "$stage" "$PREFIX.new" && $SUDO rm -rf "$PREFIX" && $SUDO mv "$PREFIX.new" "$PREFIX" ||
  fallback "cannot write $PREFIX"
say "oneDNN $ONEDNN ($VERSION) installed in $PREFIX"
