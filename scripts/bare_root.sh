#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Makes ROOT a minimal Linux root with only what the GPU machine's image has besides
# CUDA (docs/gpu.md, "A bare machine here"): the C and C++ runtimes, zlib, a shell
# and the usual tools, xz, and the compiler, CMake and make that the fallback build
# uses, copied from this machine's own Debian packages with everything they depend
# on, but no -dev package of a library mpx builds against (yaml-cpp, spdlog, fmt,
# CLI11, nlohmann-json, Catch2, oneDNN, Open MPI, zlib's headers) and no /opt. The
# CUDA toolkit is not copied: scripts/bare_root_run.sh mounts it read-only.
#
#   scripts/bare_root.sh ROOT        (ROOT must not exist or be empty)
set -euo pipefail

root=${1:?usage: scripts/bare_root.sh ROOT}
if [[ -e $root && -n $(ls -A "$root" 2>/dev/null) ]]; then
  echo "bare_root: $root exists and is not empty" >&2
  exit 2
fi
command -v dpkg-query >/dev/null || { echo "bare_root: needs dpkg (a Debian or Ubuntu machine)" >&2; exit 77; }

# What the image has, by Debian package; their dependencies are added below.
want=(libc6 libc-bin libstdc++6 libgcc-s1 zlib1g bash dash coreutils grep sed mawk findutils tar gzip xz-utils
      diffutils util-linux procps cmake make g++ gcc binutils)
# Toolchain headers that come with the compiler on any image that has one.
allowed_dev='^(libc6-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|linux-libc-dev|libcrypt-dev|libnsl-dev|libtirpc-dev)$'
# Never: what mpx builds against and the bundle must carry.
denied='^(libyaml-cpp.*|libspdlog.*|libfmt.*|libdnnl.*|catch2|libcli11-dev|nlohmann-json3-dev|libopenmpi.*|openmpi-.*|libomp.*|.*-dev)$'

# Every installed package's dependencies, read once ("a (>= 1) | b, c": the first
# alternative of each item that is installed).
declare -A is_installed=() depends=()
while IFS=$'\t' read -r pkg status deps; do
  pkg=${pkg%%:*}
  [[ $status == "install ok installed" ]] || continue
  is_installed[$pkg]=1
  depends[$pkg]=$deps
done < <(dpkg-query -W -f='${Package}\t${Status}\t${Depends}, ${Pre-Depends}\n')

declare -A seen=()
queue=()
for p in "${want[@]}"; do [[ -n ${is_installed[$p]:-} ]] && queue+=("$p"); done
while ((${#queue[@]})); do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n ${seen[$p]:-} ]] && continue
  if [[ $p =~ $denied && ! $p =~ $allowed_dev ]]; then continue; fi
  seen[$p]=1
  IFS=',' read -r -a items <<<"${depends[$p]:-}"
  for item in "${items[@]}"; do
    IFS='|' read -r -a alts <<<"$item"
    for alt in "${alts[@]}"; do
      name=${alt%%(*}
      name=${name//[[:space:]]/}
      name=${name%:any}
      [[ -z $name ]] && continue
      if [[ -n ${is_installed[$name]:-} ]]; then
        queue+=("$name")
        break
      fi
    done
  done
done

mkdir -p "$root"
for d in bin sbin lib lib32 lib64 libx32; do  # merged /usr: the same links as here
  if [[ -L /$d ]]; then
    mkdir -p "$root/$(readlink -m "/$d" | sed 's|^/||')"
    ln -s "$(readlink "/$d")" "$root/$d"
  fi
done
# Their files (no folders: tar would take a folder's whole content), in one tar pipe.
list=$(mktemp)
trap 'rm -f "$list"' EXIT
while IFS= read -r f; do
  case $f in /usr/share/doc/* | /usr/share/man/* | /usr/share/locale/* | /usr/share/info/* | /etc/* | /var/*) continue ;; esac
  [[ -L $f || -f $f ]] && printf '%s\n' "${f#/}"
done < <(dpkg -L "${!seen[@]}" 2>/dev/null) | sort -u >"$list"
tar -C / --no-recursion -cf - -T "$list" 2>/dev/null | tar -C "$root" --keep-directory-symlink -xf -
n=${#seen[@]}
# Alternatives (awk, cc, c++) point through /etc/alternatives on Debian; link them straight.
for alt in awk cc c++ gcc g++ cpp; do
  target=$(readlink -f "/usr/bin/$alt" 2>/dev/null || true)
  [[ -n $target && -e $root$target && ! -e $root/usr/bin/$alt ]] && ln -sf "$target" "$root/usr/bin/$alt"
done
mkdir -p "$root/tmp" "$root/proc" "$root/dev" "$root/etc" "$root/usr/local/cuda" "$root/work" "$root/root"
chmod 1777 "$root/tmp"
echo "root:x:0:0:root:/root:/bin/bash" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"
[[ -f /etc/os-release ]] && cp /etc/os-release "$root/etc/os-release"
# The loader's cache, made for this root (without it the default folders are searched).
chroot "$root" /sbin/ldconfig 2>/dev/null || chroot "$root" /usr/sbin/ldconfig 2>/dev/null || true
echo "bare_root: $root: $n packages, $(du -sh "$root" 2>/dev/null | cut -f1)"
