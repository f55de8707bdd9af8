#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Overlap of the gradient all-reduce with backward on the CPU path (does it pay
# there?): 2 MPI ranks,
# one per core (OMP_NUM_THREADS=1), the model of a config with random data, one
# blocking all-reduce after backward vs bucketed MPI_Iallreduce started during it.
#   bench/overlap_cpu.sh [BUILD_DIR] [CONFIG] [BATCH_PER_RANK] [STEPS] [BUCKET_KIB,...]
# (defaults: build-dist, configs/cifar10_fp32.yaml, 32, 10, 64,256,1024)
set -euo pipefail
BUILD=${1:-build-dist}
CONFIG=${2:-configs/cifar10_fp32.yaml}
BATCH=${3:-32}
STEPS=${4:-10}
BUCKETS=${5:-64,256,1024}
command -v mpirun >/dev/null || { echo "overlap_cpu.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
[ -f "$BUILD/CMakeCache.txt" ] || { echo "overlap_cpu.sh: $BUILD is not a configured build directory" >&2; exit 2; }
make -C "$BUILD" -j2 overlap_cpu_bench >/dev/null
BIN="$BUILD/bench/overlap_cpu_bench"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
mpirun --allow-run-as-root --oversubscribe --bind-to core -np 2 -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
  "$BIN" "$CONFIG" "$BATCH" "$STEPS" "$BUCKETS"
