#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest cuda_gpu_check_probe (CUDA builds): the staged GPU check's first stage on a
# machine without a GPU (docs/gpu.md "The staged GPU check"): it finds that the
# build's mpx starts, writes a results.jsonl whose every line is a JSON object, and
# stops with "no GPU" and exit 77; the next stage stops at once the same way.
# Skipped (77) where a GPU is present: there the check itself is what runs.
#   gpu_check_probe_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "SKIPPED: a GPU is present; run scripts/gpu_check.sh there"
  exit 77
fi
out=$(mktemp -d /tmp/mpx-gpu-check-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAILED: $*"; echo "--- log:"; cat "$out/gpu_check.log"; echo "--- results.jsonl:"; cat "$out/results.jsonl"; exit 1; }

OUT=$out timeout -k 5 200 "$src/scripts/gpu_check.sh" --build "$build" probe
rc=$?
[[ $rc -eq 77 ]] || fail "probe exited $rc, not 77"
grep -q "no GPU here" "$out/gpu_check.log" || fail "the log does not say 'no GPU here'"
python3 - "$out/results.jsonl" <<'PY' || fail "results.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {r["name"]: r for r in rows}
assert all(r["stage"] == "probe" for r in rows), "every line is of stage probe"
assert names["binary_starts"]["value"] is True, "the build's mpx starts"
assert names["the carried mpx starts (mpx --version)"]["status"] == "passed"
assert names["ldd"]["status"] == "passed", names["ldd"]
assert names["gpu"]["status"] == "no_gpu"
assert names["end"]["status"] == "no_gpu"
assert "host" in names and "glibc" in names["host"]
print(len(rows), "JSON lines, all parsed")
PY

OUT=$out timeout -k 5 60 "$src/scripts/gpu_check.sh" --build "$build" tests
rc=$?
[[ $rc -eq 77 ]] || fail "stage tests exited $rc without a GPU, not 77"
tail -2 "$out/results.jsonl" | grep -q '"stage":"tests","time":"[^"]*","name":"tests","status":"no_gpu"' ||
  fail "stage tests did not record no_gpu"
# A step that hangs is cut at what the stage's budget has left, recorded as a timeout, and the
# steps after it are recorded as not run; the log and the JSON lines keep everything.
(
  # shellcheck source=scripts/gpu_check_lib.sh
  source "$src/scripts/gpu_check_lib.sh"
  LOG=$out/budget.log JSONL=$out/budget.jsonl STAGE=tests FAILED=()
  SECONDS=0 STAGE_T0=0 STAGE_BUDGET=12 CALL_BUDGET=540
  step "first" 60 true
  step "hangs" 60 sleep 100
  step "after" 60 true
  [[ ${#FAILED[@]} -eq 1 && ${FAILED[0]} == hangs ]] || exit 1
  ((SECONDS < 20)) || exit 2
) >/dev/null || fail "budget: the subshell exited $?"
# shellcheck disable=SC2031  # $out is set above; the library's own `out` is a local of jline
python3 - "$out/budget.jsonl" <<'PY' || fail "budget.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["name"], r["status"]) for r in rows] == [("first", "passed"), ("hangs", "timeout"), ("after", "not_run")], rows
assert rows[1]["rc"] == 124 and rows[1]["seconds"] <= 13, rows[1]
PY
echo "gpu_check probe: stopped with no GPU as expected; a hanging step ends at the budget"
