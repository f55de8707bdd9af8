// SPDX-License-Identifier: MIT
// The CUDA backend's operations (namespace mpx::cuda), one group per file with
// the same names and order as lib/backend/cpu/ops.h. Inputs are already validated
// by Backend's public methods (op_table.inc, backend_ops.cpp). 16-bit contract as on the CPU:
// 16-bit operands, float32 math and accumulation, one rounding to nearest-even
// per 16-bit output (cuDNN/cuBLASLt: CUDNN_DATA_FLOAT / CUBLAS_COMPUTE_32F).
// Every launcher enqueues on ctx.stream() and checks its launches.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/context.h"

namespace mpx::cuda {

// The op table's ops (backend/op_table.inc), each in the file of its family, as on the
// CPU: memory.cu (fill, copy), cast.cu, conv.cpp, dense.cpp, activation.cu (activations,
// add), pool.cu (global average pooling), batch_norm.cu, loss.cu, dropout.cu, optimizer.cu.
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...) void NAME(Context& ctx, MPX_OP_ARGS PARAMS);
#include "backend/op_table.inc"

// conv.cpp (cuDNN legacy convolution API)
/// Whether cuDNN has a usable algorithm for all three passes of this convolution (the
/// heuristic's ranking, no device memory); the reason when not.
Support probe_conv2d(Context& ctx, const Conv2dParams& p, const Shape& x, const Shape& w, DType t);
/// conv_pad.cu: x [N,H,W,C] -> xp [N,Hp,Wp,Cp] (Cp >= C) with x at (top, left) and zeros around and
/// in the channels c >= C; and the crop back (channels c < C).
void pad_nhwc(Context& ctx, const Tensor& x, const Tensor& xp, int top, int left);
void crop_nhwc(Context& ctx, const Tensor& xp, const Tensor& x, int top, int left);

// activation.cu
/// Over y viewed as [M, K]: z = y + bias (bias [K], any float dtype, may be empty), pre = z
/// when pre is not empty, y = act(z), both from the float32 z.
void bias_activation(Context& ctx, const Tensor& y, const Tensor& bias, Activation act,
                     const Tensor& pre = Tensor());
/// db[k] = sum over rows of dy viewed as [M, K] (deterministic two-stage reduction).
void bias_backward(Context& ctx, const Tensor& dy, const Tensor& db);

// pool.cu
void pool_forward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y);
void pool_backward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                   const Tensor& dx);

// loss.cu
/// The same with grad_scale = step_grad_scale(*state, weight) read on the device (StepState).
void softmax_cross_entropy_scaled(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& state,
                                  double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                  const Tensor& dlogits, float label_smoothing);

// optimizer.cu
bool unscale_and_check(Context& ctx, const Tensor& grads, float inv_scale);
TensorStats stats(Context& ctx, const Tensor& x);

// optimizer.cu: the step without host synchronisation (StepState in device memory, no read back)
/// state.bad = 0; grads *= step_inv_scale(state, world); state.finite = !bad && isfinite(loss_sum).
void unscale_and_check_state(Context& ctx, const Tensor& grads, const Tensor& loss_sum, const Tensor& state,
                             int world);
/// optimizer_step with lr = *lr_dev and t = state.applied_total + 1; every thread returns when state.finite is 0.
void optimizer_step_state(Context& ctx, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                          const std::vector<Tensor>& states, const Tensor& compute_copy, const Tensor& state,
                          const Tensor& lr_dev);
/// step_state_update (step_state.h) in a one-thread kernel.
void loss_scale_update_state(Context& ctx, const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                             const Tensor& correct, int64_t n);

}  // namespace mpx::cuda
