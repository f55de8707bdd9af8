// SPDX-License-Identifier: MIT
// Convolutions with 16-bit operands on oneDNN's native bf16/f16 kernels (native16.h;
// docs/precision.md, "16-bit arithmetic on the CPU"). `wanted` is the chooser's answer
// (conv_choose.h: Native16). Each returns false, having done nothing, where the op takes
// another kernel: not wanted (recorded as widened for a 16-bit op, or as native 16-bit math
// with `own16`, where mpx's kernel multiplies on the CPU's 16-bit products: wants_native), or
// oneDNN has only a reference kernel for this shape (conv.cpp then asks the chooser again).
#pragma once

#include "backend/cpu/ops.h"

namespace mpx::cpu {

/// The activation oneDNN applies in the convolution before the output is stored, on both
/// paths: relu, and what exact_post_op (dnnl_util.h) allows, when nothing asks for the
/// pre-activation. relu's post-op turns NaN into 0, unlike the backend's relu elsewhere; it
/// stays fused because the separate NaN-keeping pass would cost as much as half the
/// convolution itself on a cheap first layer (the smoke net's 28x28x1->32 forward: ~1.5x the
/// fused time; test_backend_activations [.bench]).
Activation conv_post_op(Activation act, const Tensor& pre);

bool conv_native_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                         const Tensor& y, Activation act, const Tensor& pre, bool wanted, bool own16 = false);
bool conv_native_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                               const Tensor& dx, bool wanted);
bool conv_native_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor& db, bool wanted, bool own16 = false);

}  // namespace mpx::cpu
