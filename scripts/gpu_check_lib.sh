# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Helpers of scripts/gpu_check.sh (sourced, not run): the log and JSON-lines
# writers, steps with a time limit inside a stage budget, the library path of a
# carried build. docs/gpu.md "The staged GPU check" says how the stages use them.

# Set by gpu_check.sh: OUT_DIR, LOG, JSONL, STAGE, STAGE_T0, STAGE_BUDGET, CALL_BUDGET, FAILED.
# shellcheck disable=SC2034  # STEP_RC, STEP_OUT and FAILED are read by the caller

say() { echo "== $*" | tee -a "$LOG"; }
note() { echo "$*" | tee -a "$LOG"; }

# json_str TEXT: TEXT as a JSON string (quotes, backslashes and control characters escaped).
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/}
  s=${s//$'\t'/\\t}
  s=$(printf '%s' "$s" | tr -d '\000-\010\013\014\016-\037')
  printf '"%s"' "$s"
}

# jline key=value...: appends one JSON object to $JSONL (with the stage and the UTC time).
# Integers, decimals, true/false/null and values starting with { or [ go in as they are.
jline() {
  local out kv k v
  out="{\"stage\":$(json_str "$STAGE"),\"time\":\"$(date -u +%FT%TZ)\""
  for kv in "$@"; do
    k=${kv%%=*}
    v=${kv#*=}
    if [[ $v =~ ^-?[0-9]+(\.[0-9]+)?$ || $v == true || $v == false || $v == null || $v == \{* || $v == \[* ]]; then
      out+=",$(json_str "$k"):$v"
    else
      out+=",$(json_str "$k"):$(json_str "$v")"
    fi
  done
  echo "$out}" >>"$JSONL"
}

# Seconds left: the smaller of what this stage's budget and the whole call's budget have left.
budget_left() {
  local in_stage=$((STAGE_BUDGET - (SECONDS - STAGE_T0))) in_call=$((CALL_BUDGET - SECONDS))
  echo $((in_stage < in_call ? in_stage : in_call))
}

# step NAME LIMIT_S CMD...: runs CMD with a time limit (shortened to what the stage budget has
# left; not run at all under 10 s), output to the log, one JSON line with rc and seconds.
# Sets STEP_RC (124 = timed out, 125 = not run for lack of budget) and STEP_OUT (the last
# 4000 characters of its output).
step() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(budget_left)
  if ((left < 10)); then
    note "-- $name: not run, the budget is spent (stage ${STAGE_BUDGET} s, call ${CALL_BUDGET} s)"
    jline name="$name" status=not_run reason="budget spent"
    STEP_RC=125
    STEP_OUT=""
    return 125
  fi
  ((limit > left)) && limit=$left
  say "$name (limit ${limit} s)"
  local t0=$SECONDS tmp
  tmp=$(mktemp)
  # Into the log as it comes, so a call killed mid-step still brings back what the step printed.
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG" >"$tmp"
  STEP_RC=${PIPESTATUS[0]}
  STEP_OUT=$(tail -c 4000 "$tmp")
  tail -n 15 "$tmp"
  rm -f "$tmp"
  local secs=$((SECONDS - t0)) status=passed
  case $STEP_RC in
    0) status=passed ;;
    77) status=skipped ;;
    124 | 137) status=timeout ;;
    *) status=failed ;;
  esac
  [[ -n ${INFO_ONLY:-} && $status == failed ]] && status=unavailable
  note "-- $name: $status (rc $STEP_RC, ${secs} s)"
  jline name="$name" status="$status" rc="$STEP_RC" seconds="$secs"
  [[ ($status == failed || $status == timeout) && -z ${INFO_ONLY:-} ]] && FAILED+=("$name")
  return "$STEP_RC"
}

# info_step NAME LIMIT_S CMD...: a step whose failure is reported but fails nothing (what the
# probe asks of tools the machine may lack: nvidia-smi, PyTorch).
info_step() { INFO_ONLY=1 step "$@"; }

# unpack_libs BUILD_DIR: the carried shared libraries (BUILD_DIR/lib/*.so*, the *.xz ones
# unpacked) in a new temporary folder, whose name it prints (for LD_LIBRARY_PATH).
unpack_libs() {
  local src=$1/lib dst f base
  dst=$(mktemp -d /tmp/mpx-gpu-libs.XXXXXX)
  [[ -d $src ]] || { echo "$dst"; return; }
  for f in "$src"/*.so*; do
    [[ -f $f ]] || continue
    base=$(basename "$f")
    if [[ $f == *.xz ]]; then
      base=${base%.xz}
      if command -v xz >/dev/null 2>&1; then
        xz -dc "$f" >"$dst/$base"
      else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
          "$f" "$dst/$base"
      fi
    else
      cp -f "$f" "$dst/$base"
    fi
  done
  echo "$dst"
}

# cuda_lib_path: the library folders of the PyTorch wheels' nvidia-* packages (cuDNN, cuBLAS,
# NCCL for CUDA 13), then CUDA's own, colon-separated. The wheels' come first so that PyTorch,
# which inherits LD_LIBRARY_PATH in the bench stage, loads the libraries it was built with.
cuda_lib_path() {
  local p="" d
  if command -v python3 >/dev/null 2>&1; then
    d=$(timeout 60 python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "*.so*"))})))
PY
)
    [[ -n $d ]] && p=$d
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d $d ]] && p="$p:$d"
  done
  echo "${p#:}"
}

# has_gpu: nvidia-smi is there and lists a GPU.
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
