#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Everything a GPU lease runs, in one call, within about 9 minutes, on a machine
# with an NVIDIA GPU, the CUDA 13 runtime and PyTorch but without the build
# dependencies (yaml-cpp, spdlog, fmt, CLI11, Catch2, oneDNN): the build is made
# beforehand by scripts/gpu_bundle.sh and carried (build-gpu, with its lib/ of
# shared libraries and data-mirror/ of MNIST).
#
#   scripts/gpu_check.sh [build-dir]     (default build-gpu)
#
# Steps: build/bundle checks; nvidia-smi; mpx devices; mpx_cuda_tests;
# compute-sanitizer memcheck over 5 training steps; one MNIST epoch per policy;
# bench/gpu_compare.py (mpx vs PyTorch AMP, table last). Logs and JSON go to
# $OUT when it is set (the device tool brings them back), else to gpu-check-out/.
# Exit 0 when every step passed, 1 when one failed, 77 when there is no GPU
# (after the build/bundle checks).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD_DIR=${1:-build-gpu}
OUT_DIR=${OUT:-gpu-check-out}
mkdir -p "$OUT_DIR"
RUNS=$(mktemp -d /tmp/mpx-gpu-check.XXXXXX)
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
failed=()

say() { echo "== $*" | tee -a "$LOG"; }
# step NAME TIMEOUT_S CMD...: runs one step with a time limit, records a failure.
step() {
  local name=$1 limit=$2
  shift 2
  say "$name"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "-- $name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$LOG"
  if [[ $rc -ne 0 ]]; then failed+=("$name (rc $rc)"); fi
  return "$rc"
}

# ---- build / bundle checks (run anywhere) ------------------------------------------
MPX="$BUILD_DIR/app/mpx"
TESTS="$BUILD_DIR/tests/mpx_cuda_tests"
for b in "$MPX" "$TESTS"; do
  if [[ ! -x $b ]]; then
    echo "gpu_check: $b is missing; build it first with scripts/gpu_bundle.sh $BUILD_DIR" | tee -a "$LOG"
    exit 1
  fi
done

# Carried libraries first, then CUDA's, then the CUDA libraries of the PyTorch wheels
# (cuDNN 9 and cuBLAS for CUDA 13 come with torch's nvidia-* packages).
libs="$PWD/$BUILD_DIR/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && libs="$libs:$d"
done
if command -v python3 >/dev/null 2>&1; then
  py_libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "*.so*"))})))
PY
)
  [[ -n $py_libs ]] && libs="$libs:$py_libs"
fi
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

say "bundle: shared libraries of the binaries"
missing=$(ldd "$MPX" "$TESTS" 2>&1 | grep "not found" | sort -u)
if [[ -n $missing ]]; then
  echo "$missing" | tee -a "$LOG"
  echo "gpu_check: libraries not found (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" | tee -a "$LOG"
  failed+=("bundle libraries")
fi
step "mpx --version" 30 "$MPX" --version

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no GPU here (nvidia-smi is missing or finds no device): the build/bundle checks above are all this script can do; stopping"
  "$TESTS" | tee -a "$LOG"   # prints "skipped: no CUDA device" and exits 77
  [[ ${#failed[@]} -eq 0 ]] || { echo "failed: ${failed[*]}" | tee -a "$LOG"; exit 1; }
  exit 77
fi

# ---- on the GPU ---------------------------------------------------------------------
step "nvidia-smi" 30 nvidia-smi
step "mpx devices" 30 "$MPX" devices

step "mpx_cuda_tests" 240 "$TESTS" --durations yes

say "compute-sanitizer memcheck over 5 training steps (synthetic data)"
if command -v compute-sanitizer >/dev/null 2>&1; then
  step "compute-sanitizer memcheck" 150 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check no \
    "$MPX" train --config configs/mnist_smoke.yaml --run-dir "$RUNS/sanitizer" --no-progress \
    --set device=cuda --set data.dataset=synthetic --set train.max_steps=5 --set train.log_every=1
else
  echo "compute-sanitizer not found: step skipped" | tee -a "$LOG"
fi

# One epoch of MNIST per policy, from the carried mirror (data_scripts/get_mnist.sh verifies it).
MIRROR="$BUILD_DIR/data-mirror"
if [[ -d $MIRROR/mnist ]]; then
  if step "fetch MNIST from the carried mirror" 60 env MPX_DATA_MIRROR="$PWD/$MIRROR" \
      data_scripts/get_mnist.sh "$RUNS/data/mnist"; then
    for policy in float32 mixed_float16 mixed_bfloat16; do
      step "MNIST one epoch, $policy" 90 "$MPX" train --config configs/mnist.yaml --run-dir "$RUNS/mnist-$policy" \
        --no-progress --set device=cuda --set policy="$policy" --set train.epochs=1 --set data.path="$RUNS/data/mnist"
      [[ -f $RUNS/mnist-$policy/summary.json ]] && cp "$RUNS/mnist-$policy/summary.json" "$OUT_DIR/mnist-$policy.json"
    done
  fi
else
  echo "no MNIST mirror in $MIRROR (run scripts/gpu_bundle.sh): MNIST epochs skipped" | tee -a "$LOG"
fi

# The full-batch step replayed as a CUDA graph (train.cuda_graph, off by default until proven):
# images/s with and without it, on random inputs of CIFAR's shape.
for graph in false true; do
  step "mpx bench CIFAR ResNet mixed_bfloat16 batch 512, cuda_graph $graph" 90 "$MPX" bench \
    --config configs/cifar10_resnet.yaml --set device=cuda --set policy=mixed_bfloat16 --set data.batch_size=512 \
    --set data.path=/nonexistent --set train.cuda_graph=$graph --steps 30 --warmup 5 --json
done

step "bench/gpu_compare.py (mpx vs PyTorch, batch 512)" 300 env PYTHONUNBUFFERED=1 python3 bench/gpu_compare.py \
  --mpx "$MPX" --out "$OUT_DIR/gpu_compare.json"

rm -rf "$RUNS"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu_check: FAILED: ${failed[*]}" | tee -a "$LOG"
  exit 1
fi
echo "gpu_check: all steps passed" | tee -a "$LOG"
