#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Opt-in: installs Debian's headless chromium for the browser test of the HTML
# report (tests/report_browser.py; without it that test is skipped with the
# reason). Kept out of install_deps.sh because it is large (about 220 MB
# installed) and CI does not need it (docs/testing.md).
set -euo pipefail
PKG=chromium-headless-shell
if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed"; then
  echo "install_browser.sh: $PKG is installed"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install_browser.sh: not root and no sudo; install $PKG by hand" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$PKG"
