// SPDX-License-Identifier: MIT
// Dense layers with 16-bit operands on oneDNN's native bf16/f16 kernels (native16.h;
// docs/precision.md). Each returns false, having done nothing, where the op takes the
// widened path (float32 operands, the path not chosen on this CPU, or oneDNN only has a
// reference kernel for the shape); dense.cpp then runs its float32 kernel.
#pragma once

#include "backend/cpu/ops.h"

namespace mpx::cpu {

bool dense_native_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                          Activation act, const Tensor& pre);
bool dense_native_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx);
bool dense_native_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                   const Tensor& db);

}  // namespace mpx::cpu
