#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The GPU check, cut for one 15-minute lease (machine start, every call and idle time
# together; a call is at most 600 s): two calls, on a machine with an NVIDIA GPU, the
# CUDA 13 runtime and PyTorch but without mpx's build dependencies. The build is made
# beforehand by scripts/gpu_bundle.sh and carried (gpu-bundle). docs/gpu.md "The staged
# GPU check" has the plan and the expected device time of each stage.
#
#   scripts/gpu_check.sh [--build DIR] STAGE...      (DIR default gpu-bundle)
#
#   call 1:  MPX_CALL_BUDGET_S=300 scripts/gpu_check.sh probe tests        (timeout_s 330)
#   call 2:  MPX_CALL_BUDGET_S=270 scripts/gpu_check.sh train bench        (timeout_s 300)
#   call 2 instead, only when call 1 shows that the carried binaries do not start:
#            MPX_CALL_BUDGET_S=540 scripts/gpu_check.sh build              (timeout_s 570)
#            (it builds build-gpu-local there, then runs probe and tests on it)
#
#   probe   (budget 90 s) host, nvidia-smi, driver/runtime/library versions, ldd of the
#           carried binaries, whether the carried mpx starts, `mpx devices --json`;
#           stops with "no GPU" (exit 77) where there is none
#   tests   (210 s) every CUDA test case in its own process with its own time limit,
#           cheap to expensive; compute-sanitizer reruns the first failing case when the
#           budget still has a minute
#   train   (100 s) 20 steps of the smoke net on synthetic data under each policy, with and
#           without train.cuda_graph (the summary of each run goes into results.jsonl)
#   bench   (170 s) mpx bench of the seed CIFAR net with and without the graph, then
#           bench/gpu_compare.py on the same net (mpx against PyTorch AMP, three policies)
#   build   (540 s) the fallback: configure and build mpx there with its CMake and nvcc
#           from the carried prefix of the non-CUDA dependencies, then probe and tests on it
#
# Each stage appends to $OUT (else gpu-check-out/) as it goes: gpu_check.log (all output)
# and results.jsonl (one JSON object per step), so a call that times out keeps everything
# before it. Exit 0 when every step passed, 1 when one failed, 77 when there is no GPU.
# MPX_STAGE_BUDGET_S overrides every stage's budget; MPX_CALL_BUDGET_S (default 300) bounds
# the whole invocation, so call 1 ends inside its timeout with the results written.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu_check_lib.sh
source scripts/gpu_check_lib.sh

BUILD_DIR=gpu-bundle
if [[ ${1:-} == --build ]]; then
  BUILD_DIR=$2
  shift 2
fi
if [[ $# -eq 0 ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
OUT_DIR=${OUT:-gpu-check-out}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
JSONL="$OUT_DIR/results.jsonl"
FAILED=()
SECONDS=0
CALL_BUDGET=${MPX_CALL_BUDGET_S:-300}
STAGE=""
CARRIED_LIBS=""
RUNS=$(mktemp -d /tmp/mpx-gpu-check.XXXXXX)
MPX="$BUILD_DIR/app/mpx"
TESTS="$BUILD_DIR/tests/mpx_cuda_tests"

setup_paths() {
  CARRIED_LIBS=$(unpack_libs "$BUILD_DIR")
  local cuda
  cuda=$(cuda_lib_path)
  export LD_LIBRARY_PATH="$CARRIED_LIBS${cuda:+:$cuda}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

begin_stage() {
  STAGE=$1
  STAGE_T0=$SECONDS
  STAGE_BUDGET=${MPX_STAGE_BUDGET_S:-$2}
  say "stage $STAGE (budget ${STAGE_BUDGET} s), $(date -u +%FT%TZ), build $BUILD_DIR"
}

need_gpu() {
  if ! has_gpu; then
    note "gpu_check: no GPU here (nvidia-smi is missing or lists none): stage $STAGE not run"
    jline name="$STAGE" status=no_gpu
    finish 77
  fi
}

stage_probe() {
  begin_stage probe 90
  note "host: $(uname -srm); $(grep -s '^PRETTY_NAME=' /etc/os-release | cut -d= -f2 | tr -d '"'); $(ldd --version 2>&1 | head -1); $(nproc) cores"
  jline name=host kernel="$(uname -r)" os="$(grep -s '^PRETTY_NAME=' /etc/os-release | cut -d= -f2 | tr -d '"')" \
    glibc="$(ldd --version 2>&1 | head -1)" cores="$(nproc)"
  local b
  for b in "$MPX" "$TESTS"; do
    if [[ ! -x $b ]]; then
      note "gpu_check: $b is missing: build the bundle with scripts/gpu_bundle.sh (or run stage build here)"
      jline name=bundle status=failed reason="$b missing"
      exit 1
    fi
  done
  if command -v nvidia-smi >/dev/null 2>&1; then
    info_step "nvidia-smi" 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  else
    note "nvidia-smi: not installed"
    jline name=nvidia-smi status=missing
  fi
  if command -v python3 >/dev/null 2>&1; then
    info_step "PyTorch and its CUDA libraries" 90 python3 -c 'import json, torch; print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))'
    [[ $STEP_RC -eq 0 ]] && jline name=torch_versions value="$(echo "$STEP_OUT" | grep '^{' | tail -1)"
  fi
  local d lib where libs=()
  IFS=: read -r -a libs <<<"$LD_LIBRARY_PATH"
  for lib in libcudart.so.13 libcudnn.so.9 libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
    where=""
    for d in "${libs[@]}"; do [[ -n $d && -e $d/$lib ]] && { where=$d/$lib; break; }; done
    [[ -z $where ]] && where=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    note "library $lib: ${where:-not found}"
    jline name="library $lib" path="${where:-not found}"
  done
  local missing
  missing=$(ldd "$MPX" "$TESTS" 2>&1 | grep "not found" | sort -u | tr -s ' \t' ' ')
  note "ldd of the carried binaries: ${missing:-every library found}"
  jline name=ldd status="$([[ -z $missing ]] && echo passed || echo failed)" missing="$missing"
  [[ -n $missing ]] && FAILED+=("ldd")
  if step "the carried mpx starts (mpx --version)" 30 "$MPX" --version; then
    jline name=binary_starts value=true
  else
    note "gpu_check: the carried mpx does NOT start here (above). Fallback: scripts/gpu_check.sh build, then"
    note "           scripts/gpu_check.sh --build build-gpu-local probe tests (in the same device call)"
    jline name=binary_starts value=false
  fi
  step "mpx devices --json" 60 "$MPX" devices --json
  [[ $STEP_RC -eq 0 ]] && jline name=devices value="$(echo "$STEP_OUT" | grep '^{' | tail -1)"
  # Catch2 exits with the number of test cases listed: the list itself is the verdict.
  say "mpx_cuda_tests --list-test-names-only"
  local n_cases
  timeout -k 5 30 "$TESTS" --list-test-names-only >>"$LOG" 2>&1
  n_cases=$(timeout -k 5 30 "$TESTS" --list-test-names-only 2>/dev/null | grep -c '^\(cuda\|nccl\):')
  note "$n_cases CUDA test cases"
  jline name="CUDA test cases" value="$n_cases"
  if ((n_cases == 0)); then
    note "gpu_check: mpx_cuda_tests lists no test case"
    FAILED+=("mpx_cuda_tests lists no test case")
  fi
  if ! has_gpu; then
    note "gpu_check: no GPU here: the probe above is all that runs; stopping (exit 77)"
    jline name=gpu status=no_gpu
    finish 77
  fi
}

# Cheap to expensive: plain kernels, fused passes, cuDNN/cuBLASLt ops, graphs, NCCL, trainings
# (the first pattern that matches wins).
case_rank() {
  case $1 in
    *"batch norm"*) echo 2 ;;
    *training* | *train.sync*) echo 5 ;;
    nccl:*) echo 4 ;;
    *graph* | *Graph* | *captured*) echo 3 ;;
    *conv2d* | *dense* | *activation* | *model* | *algorithm* | *deterministic*) echo 2 ;;
    *"device info"* | *"fill and copy"* | *casts* | *normalize_input* | *"stats ("* | *"library versions"*) echo 0 ;;
    *) echo 1 ;;
  esac
}

# The Catch2 test spec that selects exactly the test case named $1: its commas, brackets,
# quotes and backslashes escaped.
case_spec() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//,/\\,}
  s=${s//[/\\[}
  s=${s//]/\\]}
  s=${s//\"/\\\"}
  printf '%s' "$s"
}

stage_tests() {
  begin_stage tests 210
  need_gpu
  local names name rank limit failed_cases=()
  names=$("$TESTS" --list-test-names-only 2>/dev/null | sed -n 's/^\(cuda\|nccl\):/&/p')
  local ordered
  ordered=$(while IFS= read -r name; do [[ -n $name ]] && printf '%s\t%s\n' "$(case_rank "$name")" "$name"; done <<<"$names" |
    sort -s -t$'\t' -k1,1n | cut -f2-)
  note "$(echo "$ordered" | grep -c .) CUDA test cases, cheap to expensive"
  while IFS= read -r name; do
    [[ -z $name ]] && continue
    rank=$(case_rank "$name")
    limit=${MPX_CASE_TIMEOUT_S:-$((rank >= 4 ? 60 : 45))}
    step "case: $name" "$limit" "$TESTS" "$(case_spec "$name")" --durations yes
    [[ $STEP_RC -ne 0 && $STEP_RC -ne 77 && $STEP_RC -ne 125 ]] && failed_cases+=("$name")
  done <<<"$ordered"
  note "tests: ${#failed_cases[@]} failing case(s)${failed_cases[*]:+: ${failed_cases[*]}}"
  jline name="failing cases" value="${#failed_cases[@]}" cases="${failed_cases[*]}"
  if ((${#failed_cases[@]} > 0)) && command -v compute-sanitizer >/dev/null 2>&1 && (($(budget_left) >= 60)); then
    name=${failed_cases[0]}
    step "compute-sanitizer memcheck: $name" 90 env MPX_TEST_CUDA_WORKSPACE_MB=32 \
      compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check no "$TESTS" "$(case_spec "$name")"
  fi
}

stage_train() {
  begin_stage train 100
  need_gpu
  local policy graph run s
  for policy in float32 mixed_float16 mixed_bfloat16; do
    for graph in false true; do
      run="$RUNS/train-$policy-graph-$graph"
      step "train 20 steps $policy cuda_graph=$graph" 30 "$MPX" train --config configs/mnist_smoke.yaml \
        --run-dir "$run" --no-progress --set device=cuda --set policy="$policy" --set data.dataset=synthetic \
        --set train.max_steps=20 --set train.log_every=5 --set train.cuda_graph=$graph
      if [[ -f $run/summary.json ]]; then
        s=$(tr -d '\n' <"$run/summary.json")
        jline name="summary $policy cuda_graph=$graph" value="$s"
      fi
      if [[ $STEP_RC -ne 0 && $STEP_RC -ne 125 ]] && command -v compute-sanitizer >/dev/null 2>&1 &&
         [[ -z ${SANITIZED_TRAIN:-} ]]; then
        SANITIZED_TRAIN=1
        step "compute-sanitizer memcheck: 3 steps $policy cuda_graph=$graph" 45 compute-sanitizer --tool memcheck \
          --error-exitcode 9 --leak-check no "$MPX" train --config configs/mnist_smoke.yaml --run-dir "$run-sanitizer" \
          --no-progress --set device=cuda --set policy="$policy" --set data.dataset=synthetic \
          --set train.max_steps=3 --set train.log_every=1 --set train.cuda_graph=$graph --set cuda.workspace_mb=32
      fi
    done
  done
}

stage_bench() {
  begin_stage bench 170
  need_gpu
  local graph
  for graph in false true; do
    step "mpx bench seed CIFAR net mixed_bfloat16 batch 512 cuda_graph=$graph" 40 "$MPX" bench \
      --config configs/cifar10_fp32.yaml --set device=cuda --set policy=mixed_bfloat16 --set data.batch_size=512 \
      --set data.path=/nonexistent --set train.cuda_graph=$graph --steps 30 --warmup 5 --json
    [[ $STEP_RC -eq 0 ]] && jline name="bench cuda_graph=$graph" value="$(echo "$STEP_OUT" | grep '^{' | tail -1)"
  done
  # The fast CIFAR recipe's step (docs/fast-cifar.md): its parameter groups, scale-free batch
  # norm and output_scale on cuDNN and cuBLAS, at its batch of 1024.
  step "mpx bench fast CIFAR recipe mixed_bfloat16 batch 1024" 40 "$MPX" bench \
    --config configs/cifar10_fast.yaml --set device=cuda --set policy=mixed_bfloat16 \
    --set data.path=/nonexistent --steps 20 --warmup 5 --json
  [[ $STEP_RC -eq 0 ]] && jline name="bench fast CIFAR recipe" value="$(echo "$STEP_OUT" | grep '^{' | tail -1)"
  step "bench/gpu_compare.py (mpx against PyTorch AMP, seed CIFAR net, batch 512)" "$(budget_left)" \
    env PYTHONUNBUFFERED=1 python3 bench/gpu_compare.py --mpx "$MPX" --configs configs/cifar10_fp32.yaml \
    --steps 30 --warmup 5 --out "$OUT_DIR/gpu_compare.json"
}

stage_build() {
  begin_stage build 540
  step "fallback build (scripts/gpu_fallback_build.sh)" "$(budget_left)" scripts/gpu_fallback_build.sh "$BUILD_DIR"
  if [[ $STEP_RC -eq 0 ]]; then
    # The same call goes on with the local build: probe and tests, inside what is left.
    BUILD_DIR=build-gpu-local
    MPX="$BUILD_DIR/app/mpx"
    TESTS="$BUILD_DIR/tests/mpx_cuda_tests"
    stage_probe
    stage_tests
  fi
}

finish() {
  rm -rf "$RUNS" "${CARRIED_LIBS:-}"
  local rc=${1:-0}
  if ((${#FAILED[@]} > 0)); then
    note "gpu_check: FAILED: ${FAILED[*]}"
    jline name=end status=failed failed="${FAILED[*]}"
    exit 1
  fi
  jline name=end status="$([[ $rc -eq 77 ]] && echo no_gpu || echo passed)"
  [[ $rc -eq 0 ]] && note "gpu_check: every step passed"
  exit "$rc"
}

setup_paths
for s in "$@"; do
  case $s in
    probe) stage_probe ;;
    tests) stage_tests ;;
    train) stage_train ;;
    bench) stage_bench ;;
    build) stage_build ;;
    *) note "gpu_check: unknown stage '$s' (probe, tests, train, bench, build)"; exit 2 ;;
  esac
done
finish 0
