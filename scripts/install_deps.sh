#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages mpx needs to build and test. Idempotent: packages
# already present are left alone and apt is not touched at all.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git ca-certificates
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev catch2
  libdnnl-dev zlib1g-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin
  python3 curl util-linux
  clang libclang-rt-dev libomp-dev
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install_deps.sh: not root and no sudo; install these packages by hand: ${PKGS[*]}" >&2
    exit 1
  fi
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps.sh: all build dependencies are installed"
else
  echo "install_deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- oneDNN 3.x from Intel's wheels on PyPI (begin) ----------------------------
# Into /opt/mpx-deps/onednn (MPX_ONEDNN_PREFIX), where CMake looks first. Never fails:
# without PyPI the build uses Debian's libdnnl-dev (oneDNN 2.6) listed above.
"$(dirname "$0")/install_onednn.sh"
# ---- oneDNN 3.x (end) ------------------------------------------------------------
