#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Data-parallel scaling on the CPU: the same training (global batch fixed) as 1
# process on 1 core and as 2 MPI ranks on 2 cores (one rank per core,
# OMP_NUM_THREADS=1); prints images/s of each, the scaling efficiency
# (ips_2 / (2 * ips_1)) and the bytes all-reduced per step.
#   bench/dist_cpu.sh [MPX_BINARY] [STEPS]      (default build-dist/app/mpx, 30 steps)
set -euo pipefail
MPX=${1:-build-dist/app/mpx}
STEPS=${2:-30}
[ -x "$MPX" ] || { echo "dist_cpu.sh: no mpx binary at $MPX (build it first)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "dist_cpu.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The mnist_smoke network on synthetic 28x28 data (no download needed); a global batch of 256.
cat > "$TMP/bench.yaml" <<YAML
name: dist_cpu
seed: 1
device: cpu
policy: float32
data: {dataset: synthetic, batch_size: 256, synthetic_train: 8192, synthetic_test: 256}
model:
  layers:
    - {type: conv2d, filters: 32, kernel: 3, activation: relu}
    - {type: max_pool, pool_size: 2}
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax}
optimizer: {name: sgd, learning_rate: 0.05, momentum: 0.9}
train: {epochs: 1, log_every: 1000, max_steps: $STEPS}
YAML
# yield_when_idle: a rank waiting in the all-reduce yields its core instead of spinning (shared cores)
export OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1
ips() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_per_sec"])' "$1/summary.json"; }

taskset -c 0 "$MPX" train --no-progress --config "$TMP/bench.yaml" --run-dir "$TMP/one" > "$TMP/one.log" 2>&1
mpirun --allow-run-as-root --oversubscribe --bind-to core -np 2 -x OMP_NUM_THREADS \
  "$MPX" train --no-progress --config "$TMP/bench.yaml" --run-dir "$TMP/two" > "$TMP/two.log" 2>&1
IPS1=$(ips "$TMP/one")
IPS2=$(ips "$TMP/two")
BYTES=$(grep -o 'one all-reduce ([a-z ]*) of [0-9]* B' "$TMP/two.log" | grep -o '[0-9]* B' | head -1)
python3 - "$IPS1" "$IPS2" "$BYTES" "$STEPS" <<'PY'
import sys
ips1, ips2, nbytes, steps = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"steps: {steps} of a global batch of 256 (2 ranks: 128 each)")
print(f"1 rank  (1 core):  {ips1:8.0f} images/s")
print(f"2 ranks (2 cores): {ips2:8.0f} images/s")
print(f"scaling efficiency: {ips2 / (2 * ips1) * 100:.0f}%  (images/s of 2 ranks / (2 x 1 rank))")
print(f"all-reduced per step: {nbytes} (float32 gradient arena) + 40 B of metrics")
PY
