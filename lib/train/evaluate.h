// SPDX-License-Identifier: MIT
// Test-set evaluation: the loop shared by training (each evaluated epoch),
// `mpx eval --checkpoint` and `mpx eval --weights`.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "data/dataset.h"
#include "dist/communicator.h"
#include "nn/model.h"
#include "train/batch.h"

namespace mpx {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
  std::string policy;
};

/// @brief Evaluates `model` (inference mode) over the whole of `ds`; loss summed in double.
/// With several ranks each evaluates a contiguous slice of `ds` and the sums are all-reduced.
EvalResult evaluate_model(Backend& be, Model& model, BatchBuffers& bb, const Dataset& ds, Communicator* comm = nullptr);

/// @brief `mpx eval --checkpoint`: test loss/accuracy of a checkpoint (file or run directory).
EvalResult evaluate_checkpoint(const Config& cfg, const std::string& checkpoint);

/// @brief `mpx eval --weights W`: test loss/accuracy of a safetensors file (either layout).
EvalResult evaluate_weights(const Config& cfg, const std::string& weights);

}  // namespace mpx
