// SPDX-License-Identifier: MIT
// `mpx bench`: times training steps of a config (real data when it loads, else
// random inputs of the data set's shape).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "nn/model.h"

namespace mpx {

struct BenchResult {
  double images_per_sec = 0, step_ms_median = 0, step_ms_min = 0, step_ms_max = 0;
  /// train.sync log only (else 0): images/s of `steps` more steps timed as one block, the
  /// device synchronised at the end only (what a training run sees).
  double images_per_sec_pipelined = 0;
  size_t peak_memory_bytes = 0;
  std::string policy, device;
  int64_t batch_size = 0, steps = 0;
  MemoryReport memory;
  /// The backend's compute library and the kernels it chose for the timed steps.
  std::string library;
  std::vector<KernelChoice> kernels;
  /// The layers whose forward ran in pieces of the batch (Model::piece_runs).
  std::vector<std::string> pieces;
  /// The convolutions and max poolings whose forward ran in one op (Model::conv_pool_runs).
  std::vector<std::string> conv_pool;
  /// The cuDNN / cuBLASLt plans the backend chose (empty on the CPU).
  std::vector<PlanReport> plans;
  /// How the 16-bit convolutions and dense layers ran (CPU: native kernels or widened).
  std::vector<Math16Report> math16;
};

/// @brief Times `steps` training steps after `warmup`. Throws ConfigError for steps <= 0 or warmup < 0.
BenchResult bench(const Config& cfg, int64_t steps, int64_t warmup);

}  // namespace mpx
