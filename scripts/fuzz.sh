#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every libFuzzer target of fuzz/ (built by the `fuzz` preset into build-fuzz/)
# for SECONDS each (default 60) on its seed corpus fuzz/corpus/<target>/, and fails
# on the first finding (docs/testing.md, "Fuzzing"). New inputs go to
# build-fuzz/fuzz-work/<target>/; a finding is saved as build-fuzz/fuzz-work/<target>-crash-*.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 3600 fuzz_config
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-60}
shift || true
BUILD_DIR=${BUILD_DIR:-build-fuzz}
TARGETS=("$@")
[[ ${#TARGETS[@]} -eq 0 ]] && TARGETS=(fuzz_config fuzz_idx fuzz_cifar fuzz_checkpoint fuzz_safetensors fuzz_report)

# Largest input per target: a little over the largest seed (a CIFAR-10 record is 3073 bytes).
declare -A MAX_LEN=([fuzz_config]=8192 [fuzz_idx]=16384 [fuzz_cifar]=16384 [fuzz_checkpoint]=65536
                    [fuzz_safetensors]=65536 [fuzz_report]=65536)
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for t in "${TARGETS[@]}"; do
  bin=$BUILD_DIR/fuzz/$t
  [[ -x $bin ]] || { echo "fuzz.sh: $bin not built (cmake --preset fuzz && cmake --build --preset fuzz)" >&2; exit 2; }
  work=$BUILD_DIR/fuzz-work/$t
  mkdir -p "$work"
  log=$BUILD_DIR/fuzz-work/$t.log
  # -rss_limit_mb bounds the whole process; the targets hold each reader to what its input
  # justifies themselves (fuzz/fuzz_support.h). Both the work folder and the seeds are read;
  # only the work folder is written.
  if "$bin" -max_total_time="$SECONDS_EACH" -max_len="${MAX_LEN[$t]:-65536}" -rss_limit_mb=2048 \
       -malloc_limit_mb=1024 -timeout=20 -print_final_stats=1 -artifact_prefix="$BUILD_DIR/fuzz-work/$t-" \
       "$work" "fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'cov: [0-9]*' || true)
    echo "fuzz.sh: $t: ${SECONDS_EACH} s, ${runs:-?} executions, ${cov:-cov: ?}, no finding"
  else
    echo "fuzz.sh: $t FOUND A DEFECT (log: $log):" >&2
    grep -E 'contract broken|ERROR: |runtime error|SUMMARY|Test unit written' "$log" | head -20 >&2 || tail -30 "$log" >&2
    failed=1
  fi
done
exit $failed
