// SPDX-License-Identifier: MIT
// `mpx validate` on a GPU config: where Tensor Cores will sit idle (16-bit layers
// whose channels, units or batch are not multiples of 8; a 16-bit policy on a GPU
// without Tensor Cores). Pure shape/dtype inspection: needs no GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model.h"

namespace mpx {

/**
 * @brief One line per place the 16-bit layers of `model` will not use Tensor Cores
 * on a GPU of `compute_capability` (10*major+minor; 0 = unknown, e.g. no GPU visible
 * here), each naming the layer, the value and what to change:
 *  - a 16-bit policy (or 16-bit layers) with 0 < compute_capability < 70: no Tensor
 *    Cores at all (then nothing per layer); bfloat16 layers below 80: no bfloat16
 *    Tensor Cores (then nothing per layer for them);
 *  - 16-bit conv2d layers (the residual projections included) whose filters or input
 *    channels, and 16-bit dense layers whose units or input features, are not
 *    multiples of 8 (the first conv on a 1- or 3-channel image is said to be expected);
 *  - a batch size not a multiple of 8 while any layer computes in 16 bits.
 * Layers whose compute dtype is float32 (policy float32, or `dtype: float32` on the
 * layer) are never reported. The caller decides whether the config targets a GPU.
 */
std::vector<std::string> tensor_core_warnings(const Model& model, int64_t batch_size, int compute_capability);

}  // namespace mpx
