// SPDX-License-Identifier: MIT
// `mpx inspect`: one forward and backward pass on the first test images under
// the config's policy, every layer's activation and input gradient summarized
// (and dumped to safetensors), so the first layer that overflows or underflows
// is visible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/tensor.h"
#include "train/trainer.h"

namespace mpx {

struct InspectOptions {
  std::string weights;     // safetensors file ("" = none)
  std::string checkpoint;  // checkpoint file or run directory ("" = none)
  std::string out;         // dump file ("" = no dump)
  int64_t batch = 32;      // first N test images
};

/// One tensor of the pass and its statistics.
struct InspectRow {
  std::string layer, type;
  std::string tensor;  // "output", "input_grad", or the parameter name (kernel, bias, gamma, beta)
  int depth = 0;
  DType dtype = DType::F32;
  Shape shape;
  TensorStats stats;
};

struct InspectResult {
  std::string policy, device;
  std::string weights_from;  // where the weights came from, for the report
  int64_t n = 0;             // images in the batch
  double loss = 0;           // mean softmax cross-entropy (unscaled)
  double loss_scale = 1;     // S: loss_scale.initial under dynamic/fixed, 1 under none
  std::vector<InspectRow> forward;       // layer outputs, execution order
  std::vector<InspectRow> backward;      // input gradients, from the loss back to the input
  std::vector<InspectRow> weight_grads;  // float32 weight gradients (scaled by S), backward order
  /// "" when every activation and gradient is finite, else e.g.
  /// "dense_1 (dense): float16 output: 12 inf, 0 NaN" (forward first, then backward).
  std::string first_nonfinite;
};

/**
 * @brief Runs the pass: weights from opts.weights, else opts.checkpoint, else
 * weights.init_from, else the seeded initialization. A training-mode forward
 * (batch statistics, dropout with the config's seed) feeds the backward pass of
 * d(S * mean loss); an inference-mode forward gives the "eval/logits" of the dump.
 * Writes opts.out when set (tensors named "<layer>/output", "<layer>/input_grad",
 * "grads/<layer>/<param>" (keras layout), "logits", "eval/logits", "labels",
 * "loss", "loss_scale"). Throws ConfigError / DataError.
 */
InspectResult inspect(const Config& cfg, const InspectOptions& opts);

/// @brief The table `mpx inspect` prints: per tensor dtype, shape, min, max,
/// mean |x| (over finite values), #inf, #NaN, #zero; then loss, scale and verdict.
std::string format_inspect(const InspectResult& r);

}  // namespace mpx
