#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a command inside ROOT (made by scripts/bare_root.sh) as on the GPU machine's
# image (docs/gpu.md, "A bare machine here"): in a private mount namespace, with the
# CUDA toolkit mounted read-only at /usr/local/cuda, SRC (the working tree with its
# gpu-bundle/) mounted read-only at /work, /proc and /dev, and the working directory
# /work, and a clean environment (set what the command needs with env). Needs root (CI
# runs as root); exits 77 where namespaces or chroot are not allowed.
#
#   scripts/bare_root_run.sh ROOT SRC COMMAND...
set -euo pipefail

root=${1:?usage: scripts/bare_root_run.sh ROOT SRC COMMAND...}
src=${2:?usage: scripts/bare_root_run.sh ROOT SRC COMMAND...}
shift 2
cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
if [[ $(id -u) -ne 0 ]]; then
  echo "bare_root_run: needs root (mount namespace and chroot)" >&2
  exit 77
fi
if ! unshare --mount true 2>/dev/null; then
  echo "bare_root_run: this machine allows no mount namespace" >&2
  exit 77
fi

# shellcheck disable=SC2016  # expanded by the inner shell
exec unshare --mount --propagation private -- bash -c '
  set -e
  root=$1 src=$2 cuda=$3
  shift 3
  mount --bind "$cuda" "$root/usr/local/cuda"
  mount -o remount,bind,ro "$root/usr/local/cuda"
  mount --bind "$src" "$root/work"
  mount -o remount,bind,ro "$root/work"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/cuda/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    TMPDIR=/tmp LANG=C.UTF-8 /bin/bash -c "cd /work && \"\$@\"" bash "$@"
' bash "$root" "$src" "$cuda" "$@"
