#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The fast-CIFAR recipe's accuracy and time (docs/fast-cifar.md, "Measuring it"): trains
# configs/cifar10_fast.yaml (or CONFIG) for each policy and seed, evaluates each run on the
# 1,000 lossless test records, on the 10,000 JPEG-decoded ones and on their first 1,000, and
# prints one row per run and the mean and spread per policy, with the run's training FLOPs
# (direct-convolution equivalent) over its wall time against the float32 GEMM ceiling measured
# in the same session, and the CPU and kernels that ran. Long: about 20-40 minutes per run on a
# 2-core CPU. Run it on a quiet machine.
#   bench/fast_cifar.sh [--seeds N] [--first-seed K] [--policies float32,mixed_bfloat16] [--data DIR]
#                       [--out DIR]
#                       [--set key=value ...]   (extra --set for every run, e.g. train.epochs=2)
#                       [--peer torch [--peer-compile]] [--keep-done]
# --keep-done keeps a seed's run that an earlier call finished under --out (summary.json status
# completed, both evaluations written): it is reported again, not retrained, so the seeds of a
# policy can be gathered over several calls (its time is its own; the ceiling is this call's).
# --first-seed K runs seeds K..N only (default 1), e.g. the fifth seed on another day or machine.
# --peer torch also trains the recipe's PyTorch twin (bench/fast_cifar_torch.py: the same YAML, data,
# order, augmentation, initial weights, epochs, batch and threads) after each mpx run, with the same
# policy and seed, and prints its rows in the same table with the ratio of its time to mpx's;
# --peer-compile runs it under torch.compile. The twin runs in the venv of bench/torch_setup.sh
# (MPX_PEER_VENV overrides it); of the --set keys it follows train.epochs and data.train_limit only.
# Threads: OMP_NUM_THREADS for mpx and the twin alike (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

SEEDS=5
FIRST_SEED=1
KEEP_DONE=0
POLICIES=float32,mixed_bfloat16
DATA=${MPX_DATA_MIRROR:-../shared/data}
OUT=${TMPDIR:-/tmp}/mpx-fast-cifar-$$
CONFIG=${CONFIG:-configs/cifar10_fast.yaml}
MPX=${MPX:-build/app/mpx}
CEILING=${CEILING:-build/bench/gemm_ceiling}
EXTRA=()
PEER=
PEER_ARGS=()
THREADS=${OMP_NUM_THREADS:-$(nproc)}
while [[ $# -gt 0 ]]; do
  case $1 in
    --seeds) SEEDS=$2; shift 2 ;;
    --first-seed) FIRST_SEED=$2; shift 2 ;;
    --policies) POLICIES=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    --peer) PEER=$2; shift 2 ;;
    --peer-compile) PEER_ARGS+=(--compile); shift ;;
    --keep-done) KEEP_DONE=1; shift ;;
    *) echo "fast_cifar.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ $SEEDS =~ ^[0-9]+$ && $FIRST_SEED =~ ^[0-9]+$ && $FIRST_SEED -ge 1 && $FIRST_SEED -le $SEEDS ]] ||
  { echo "fast_cifar.sh: --first-seed $FIRST_SEED --seeds $SEEDS: need 1 <= K <= N (whole numbers)" >&2; exit 2; }
for f in "$MPX" "$CEILING"; do
  [[ -x $f ]] || { echo "fast_cifar.sh: $f is not built (scripts/build.sh)" >&2; exit 2; }
done
for f in "$DATA/cifar10/data_batch_5.bin" "$DATA/cifar10/test_batch.bin" "$DATA/cifar10-test-jpeg/test_batch.bin"; do
  [[ -f $f ]] || { echo "fast_cifar.sh: $f is missing (--data DIR: the shared data folder)" >&2; exit 2; }
done
if [[ -n $PEER ]]; then
  [[ $PEER == torch ]] || { echo "fast_cifar.sh: --peer $PEER: only torch has a twin of the recipe" >&2; exit 2; }
  PEER_PY=${MPX_PEER_VENV:-$HOME/.cache/mpx-peers/torch}/bin/python
  [[ -x $PEER_PY ]] || { echo "fast_cifar.sh: $PEER_PY is missing (bench/torch_setup.sh)" >&2; exit 2; }
  # The twin follows the --set keys that change what is trained; any other would make the two runs differ.
  for ((i = 1; i < ${#EXTRA[@]}; i += 2)); do
    case ${EXTRA[i]} in
      train.epochs=*) PEER_ARGS+=(--epochs "${EXTRA[i]#*=}") ;;
      data.train_limit=*) PEER_ARGS+=(--train-limit "${EXTRA[i]#*=}") ;;
      *) echo "fast_cifar.sh: --peer torch cannot follow --set ${EXTRA[i]}" >&2; exit 2 ;;
    esac
  done
fi
export OMP_NUM_THREADS=$THREADS
mkdir -p "$OUT"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores," \
     "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|fma|f16c|avx512f|avx512_bf16|avx512_fp16|amx_bf16' |
               tr '\n' ' ')"
"$MPX" devices 2>/dev/null | sed 's/^/  /' || true
ceiling=$("$CEILING" 2048 10)
echo "float32 GEMM ceiling: $ceiling"

IFS=, read -r -a pols <<< "$POLICIES"
rows=()
for p in "${pols[@]}"; do
  echo "== $p: the kernels that run (mpx bench, a few steps)"
  "$MPX" bench --config "$CONFIG" --set "data.path=$DATA/cifar10" --set "policy=$p" --steps 4 --warmup 1 "${EXTRA[@]}" 2>&1 |
    grep -v '^\s*$' | sed 's/^/  /' || true
  for ((s = FIRST_SEED; s <= SEEDS; ++s)); do
    run="$OUT/$p-seed$s"
    if [[ $KEEP_DONE == 1 && -s $run.jpeg10k.json && -s $run.jpeg1k.json && -f $run/summary.json ]] &&
       python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("status") != "completed")' \
         "$run/summary.json" 2>/dev/null; then
      echo "== $p seed $s: kept, trained by an earlier call ($run)"
      rows+=("$p $s $run")
      [[ -n $PEER && -s $run.torch.json ]] && rows+=("torch:$p $s $run")
      continue
    fi
    echo "== $p seed $s -> $run"
    "$MPX" train --config "$CONFIG" --run-dir "$run" --overwrite --no-progress \
      --set "data.path=$DATA/cifar10" --set "policy=$p" --set "seed=$s" "${EXTRA[@]}" > "$run.train.txt" 2>&1 ||
      { echo "training failed: $run.train.txt"; tail -5 "$run.train.txt"; continue; }
    "$MPX" eval --checkpoint "$run" --test-data "$DATA/cifar10-test-jpeg" --json --no-progress > "$run.jpeg10k.json"
    "$MPX" eval --checkpoint "$run" --test-data "$DATA/cifar10-test-jpeg" --set data.test_limit=1000 --json \
      --no-progress > "$run.jpeg1k.json"
    rows+=("$p $s $run")
    if [[ -n $PEER ]]; then
      echo "== torch $p seed $s -> $run.torch.json"
      if "$PEER_PY" bench/fast_cifar_torch.py --config "$CONFIG" --data "$DATA" --policy "$p" --seed "$s" \
           --threads "$THREADS" "${PEER_ARGS[@]}" --json > "$run.torch.out" 2> "$run.torch.txt"; then
        tail -1 "$run.torch.out" > "$run.torch.json"
        rows+=("torch:$p $s $run")
      else
        echo "the twin failed: $run.torch.txt"; tail -5 "$run.torch.txt"
      fi
    fi
  done
done

python3 - "$CONFIG" "$ceiling" "${rows[@]}" <<'PYEOF'
import json, math, statistics, sys
import yaml

config_path, ceiling = sys.argv[1], json.loads(sys.argv[2])
ceiling_gflops = ceiling.get("gflops_median") or ceiling.get("gflops") or max(ceiling.get("gflops_all", [0]))
cfg = yaml.safe_load(open(config_path))

def train_flops(cfg, images):
    """Multiply-adds x 2 of forward, backward-data and backward-filter of every conv2d and
    dense layer (the first layer has no backward-data), as direct convolutions."""
    h, w, c = cfg["model"].get("input_shape", [32, 32, 3])
    total, first = 0.0, True
    for L in cfg["model"]["layers"]:
        t = L["type"]
        if t == "conv2d":
            k = L.get("kernel", 3); kh, kw = (k, k) if isinstance(k, int) else k
            s = L.get("strides", 1); sh, sw = (s, s) if isinstance(s, int) else s
            if L.get("padding", "valid") == "same":
                p, q = -(-h // sh), -(-w // sw)
            else:
                p, q = (h - kh) // sh + 1, (w - kw) // sw + 1
            fwd = 2.0 * p * q * L["filters"] * kh * kw * c
            total += fwd * (2 if first else 3)
            h, w, c, first = p, q, L["filters"], False
        elif t in ("max_pool", "avg_pool"):
            k = L.get("pool_size", 2); kh, kw = (k, k) if isinstance(k, int) else k
            s = L.get("strides", k); sh, sw = (s, s) if isinstance(s, int) else s
            h, w = (h - kh) // sh + 1, (w - kw) // sw + 1
        elif t == "global_avg_pool":
            h, w = 1, 1
        elif t == "flatten":
            h, w, c = 1, 1, h * w * c
        elif t == "dense":
            fwd = 2.0 * h * w * c * L["units"]
            total += fwd * (2 if first else 3)
            h, w, c, first = 1, 1, L["units"], False
    return total * images

print(f"\n{'policy':<22}{'seed':>5}{'lossless 1k':>13}{'jpeg 10k':>10}{'jpeg 1k':>9}{'jpeg penalty pp':>17}"
      f"{'to final s':>12}{'s/epoch':>9}{'img/s':>8}{'FLOP/s / ceiling':>18}")
by_policy = {}
for row in sys.argv[3:]:
    policy, seed, run = row.split(" ", 2)
    if policy.startswith("torch:"):  # the PyTorch twin (bench/fast_cifar_torch.py --json)
        r = json.load(open(f"{run}.torch.json"))
        acc, j10, j1 = r["final_test_accuracy"], r["jpeg10k_accuracy"], r["jpeg1k_accuracy"]
        wall, epochs, steps, ips, spe = r["wall_seconds"], r["epochs"], r["steps"], r["images_per_sec"], r["seconds_per_epoch"]
        policy += " (compiled)" if r.get("compiled") else ""
    else:
        summary = json.load(open(f"{run}/summary.json"))
        acc = summary["final_test_accuracy"]
        j10 = json.load(open(f"{run}.jpeg10k.json"))["accuracy"]
        j1 = json.load(open(f"{run}.jpeg1k.json"))["accuracy"]
        # From the first step to the end of the final (TTA) evaluation, as the twin's.
        wall = summary.get("seconds_from_first_step", summary["wall_seconds"])
        epochs, steps, ips = summary["epochs"], summary["steps"], summary["images_per_sec"]
        spe = wall / max(1, epochs)
    flops = train_flops(cfg, steps * cfg["data"]["batch_size"])
    ratio = flops / wall / 1e9 / ceiling_gflops if ceiling_gflops else float("nan")
    by_policy.setdefault(policy, []).append((acc, j10, wall, ratio))
    print(f"{policy:<22}{seed:>5}{100 * acc:>12.2f}%{100 * j10:>9.2f}%{100 * j1:>8.2f}%"
          f"{100 * (acc - j1):>17.2f}{wall:>12.1f}{spe:>9.1f}{ips:>8.0f}{ratio:>17.2f}x")
print(f"\nfloat32 GEMM ceiling {ceiling_gflops:.0f} GFLOP/s; training {train_flops(cfg, 1) / 1e9:.3f} GFLOP per image "
      "(direct-convolution equivalent); test sets: lossless = cifar10/test_batch.bin (1,000), "
      "jpeg = cifar10-test-jpeg (10,000; 1k = its first 1,000, the JPEG twins of the lossless ones); "
      "to final s: from the first step to the end of the final evaluation (mpx: summary.json's seconds_from_first_step)")
for policy, v in by_policy.items():
    accs = [a for a, _, _, _ in v]
    sd = f"sd {100 * statistics.stdev(accs):.2f} pp" if len(accs) > 1 else "sd n/a with one seed"
    print(f"{policy}: {len(v)} seed{'s' if len(v) > 1 else ''}, lossless mean {100 * statistics.mean(accs):.2f}% ({sd}, "
          f"min {100 * min(accs):.2f}, max {100 * max(accs):.2f}), jpeg 10k mean "
          f"{100 * statistics.mean(j for _, j, _, _ in v):.2f}%, time mean {statistics.mean(w for _, _, w, _ in v):.0f} s, "
          f"FLOP/s over the ceiling {statistics.mean(r for _, _, _, r in v):.2f}x")
mean_time = {p: statistics.mean(w for _, _, w, _ in v) for p, v in by_policy.items()}
mean_acc = {p: statistics.mean(a for a, *_ in v) for p, v in by_policy.items()}
for prefix in ("", "torch:"):
    f32 = next((p for p in by_policy if p.split(" ")[0] == prefix + "float32"), None)
    bf16 = next((p for p in by_policy if p.split(" ")[0] == prefix + "mixed_bfloat16"), None)
    if f32 and bf16:
        print(f"{f32} - {bf16} mean lossless accuracy: {100 * (mean_acc[f32] - mean_acc[bf16]):+.2f} pp")
mpx_p = [p for p in by_policy if not p.startswith("torch:")]
torch_p = [p for p in by_policy if p.startswith("torch:")]
for p in mpx_p:
    for q in torch_p:
        if q.split(" ")[0] == "torch:" + p:
            print(f"{p}: torch time / mpx time {mean_time[q] / mean_time[p]:.2f} (lossless mean: mpx "
                  f"{100 * mean_acc[p]:.2f}%, torch {100 * mean_acc[q]:.2f}%)")
if mpx_p and torch_p:
    bm, bt = min(mpx_p, key=mean_time.get), min(torch_p, key=mean_time.get)
    print(f"fastest of each: mpx {bm} {mean_time[bm]:.0f} s ({100 * mean_acc[bm]:.2f}%), {bt} {mean_time[bt]:.0f} s "
          f"({100 * mean_acc[bt]:.2f}%): torch time / mpx time {mean_time[bt] / mean_time[bm]:.2f}")
PYEOF
