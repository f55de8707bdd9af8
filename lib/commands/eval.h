// SPDX-License-Identifier: MIT
// `mpx eval --checkpoint` and `mpx eval --weights`: the test-set loop of training
// (train/evaluate.h) over the weights of a checkpoint or a safetensors file.
#pragma once

#include <string>

#include "config/config.h"
#include "train/evaluate.h"

namespace mpx {

/// @brief `mpx eval --checkpoint`: test loss/accuracy of a checkpoint (file or run directory).
/// `progress`: the live progress line on a terminal, as `mpx train` shows it.
/// cfg.train.tta applies, and the test split is read from cfg.data as configured.
EvalResult evaluate_checkpoint(const Config& cfg, const std::string& checkpoint, bool progress = false);

/// @brief `mpx eval --weights W`: test loss/accuracy of a safetensors file (either layout).
EvalResult evaluate_weights(const Config& cfg, const std::string& weights, bool progress = false);

}  // namespace mpx
