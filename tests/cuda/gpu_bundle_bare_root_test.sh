#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest cuda_bundle_bare_root (CUDA builds, as root): the GPU bundle starts on a machine
# that has only what the GPU machine's image has (docs/gpu.md, "A bare machine here").
# The bundle is assembled from this build by scripts/gpu_bundle.sh (MPX_BUNDLE_FROM), a
# bare root is made by scripts/bare_root.sh (C/C++ runtimes, zlib, shell tools, compiler,
# CMake; no library mpx builds against, no /opt) and, inside it (scripts/bare_root_run.sh,
# the CUDA toolkit mounted read-only):
#   - the carried binaries do not load without the bundle's libraries (the root is bare);
#   - stage probe of scripts/gpu_check.sh passes as far as a machine without a GPU goes:
#     every library found, `mpx --version` and `mpx devices --json` run,
#     `mpx_cuda_tests --list-test-names-only` lists the CUDA cases, then exit 77 (no GPU);
#   - the fallback's configure (scripts/gpu_fallback_build.sh, FALLBACK_CONFIGURE_ONLY=1)
#     succeeds against the carried prefix, with the carried oneDNN.
# Skipped (77) where not root or where mount namespaces are not allowed.
#   gpu_bundle_bare_root_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIPPED: needs root (a private mount namespace and chroot)"
  exit 77
fi
if ! unshare --mount true 2>/dev/null; then
  echo "SKIPPED: no mount namespace allowed here"
  exit 77
fi
work=$(mktemp -d /tmp/mpx-bare-root-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
fail() {
  echo "FAILED: $*"
  [[ -f $root/tmp/out/gpu_check.log ]] && { echo "--- gpu_check.log:"; cat "$root/tmp/out/gpu_check.log"; }
  [[ -f $root/tmp/out/results.jsonl ]] && { echo "--- results.jsonl:"; cat "$root/tmp/out/results.jsonl"; }
  exit 1
}
inside() { timeout -k 5 "$1" "$src/scripts/bare_root_run.sh" "$root" "$src" "${@:2}"; }

echo "== the bundle, from $build"
MPX_BUNDLE_FROM=$build BUNDLE=$work/bundle LIMIT_MIB=1024 timeout -k 5 300 "$src/scripts/gpu_bundle.sh" ||
  fail "scripts/gpu_bundle.sh exited $?"
echo "== the bare root"
timeout -k 5 240 "$src/scripts/bare_root.sh" "$root" || fail "scripts/bare_root.sh exited $?"
cp -a "$work/bundle" "$root/bundle"
for f in "$root"/usr/include/{yaml-cpp,spdlog,fmt,CLI,nlohmann,catch2,dnnl.hpp,zlib.h} "$root/opt"; do
  [[ -e $f ]] && fail "the bare root has $f"
done

echo "== inside: the carried binaries need the carried libraries"
inside 60 ldd /bundle/app/mpx >"$work/ldd.txt" 2>&1
grep -q "libdnnl.so.* => not found" "$work/ldd.txt" || { cat "$work/ldd.txt"; fail "libdnnl resolves in the bare root without the bundle: the root is not bare"; }

echo "== inside: scripts/gpu_check.sh --build /bundle probe"
inside 240 env OUT=/tmp/out scripts/gpu_check.sh --build /bundle probe
rc=$?
[[ $rc -eq 77 ]] || fail "probe exited $rc, not 77 (no GPU)"
python3 - "$root/tmp/out/results.jsonl" <<'PY' || fail "results.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {r["name"]: r for r in rows}
assert names["ldd"]["status"] == "passed", names["ldd"]
assert names["binary_starts"]["value"] is True, "the carried mpx starts"
assert names["mpx devices --json"]["status"] == "passed", names["mpx devices --json"]
dev = names["devices"]["value"]
assert isinstance(dev, dict) and "cpu" in json.dumps(dev).lower(), dev
assert names["CUDA test cases"]["value"] > 0, names["CUDA test cases"]
assert names["gpu"]["status"] == "no_gpu" and names["end"]["status"] == "no_gpu"
print(f"probe in the bare root: every library found, mpx starts, {names['CUDA test cases']['value']} CUDA test cases")
PY

echo "== inside: the fallback's configure against the carried prefix"
inside 300 env FALLBACK_CONFIGURE_ONLY=1 FALLBACK_DEPS_DIR=/tmp/deps scripts/gpu_fallback_build.sh /bundle \
  /tmp/build-local >"$work/configure.log" 2>&1
rc=$?
[[ $rc -eq 0 ]] || { cat "$work/configure.log"; fail "the fallback's configure exited $rc"; }
grep -q "oneDNN from the carried prefix" "$work/configure.log" || { cat "$work/configure.log"; fail "the carried oneDNN was not used"; }
grep -q "^dnnl_DIR:PATH=/tmp/deps/onednn" "$root/tmp/build-local/CMakeCache.txt" ||
  { grep -i dnnl "$root/tmp/build-local/CMakeCache.txt"; fail "CMake did not find oneDNN in the carried prefix"; }
echo "gpu_bundle_bare_root: the bundle starts on a bare root and its fallback configures there"
