// SPDX-License-Identifier: MIT
// Dense layers with 16-bit operands on oneDNN's native bf16/f16 kernels (native16.h;
// docs/precision.md). `wanted` is the chooser's answer (dense_choose.h: Native16). Each
// returns false, having done nothing, where the op takes another kernel: not wanted (recorded
// as widened for a 16-bit op, or as native 16-bit math with `own16`, where mpx's loops
// multiply on the CPU's bfloat16 dot products: wants_native), or oneDNN has only a reference
// kernel for the shape (dense.cpp then asks the chooser again).
#pragma once

#include "backend/cpu/ops.h"

namespace mpx::cpu {

bool dense_native_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                          Activation act, const Tensor& pre, bool wanted, bool own16 = false);
bool dense_native_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx, bool wanted,
                                bool own16 = false);
bool dense_native_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                   const Tensor& db, bool wanted, bool own16 = false);

}  // namespace mpx::cpu
