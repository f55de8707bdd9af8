// SPDX-License-Identifier: MIT
// The CUDA backend's operations (namespace mpx::cuda), one group per file with
// the same names and order as lib/backend/cpu/ops.h. Inputs are already validated
// by Backend's public methods (backend.cpp). 16-bit contract as on the CPU:
// 16-bit operands, float32 math and accumulation, one rounding to nearest-even
// per 16-bit output (cuDNN/cuBLASLt: CUDNN_DATA_FLOAT / CUBLAS_COMPUTE_32F).
// Every launcher enqueues on ctx.stream() and checks its launches.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/context.h"

namespace mpx::cuda {

// memory.cu
void fill(Context& ctx, const Tensor& dst, float value);
void copy(Context& ctx, const Tensor& dst, const Tensor& src);

// cast.cu
void cast(Context& ctx, const Tensor& src, const Tensor& dst);
void normalize_input(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& std, const Tensor& y);

// conv.cpp (cuDNN legacy convolution API)
void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre);
void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w, const Tensor& dx);
void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db);
/// Whether cuDNN has a usable algorithm for all three passes of this convolution (the
/// heuristic's ranking, no device memory); the reason when not.
Support probe_conv2d(Context& ctx, const Conv2dParams& p, const Shape& x, const Shape& w, DType t);
/// conv_pad.cu: x [N,H,W,C] -> xp [N,Hp,Wp,Cp] (Cp >= C) with x at (top, left) and zeros around and
/// in the channels c >= C; and the crop back (channels c < C).
void pad_nhwc(Context& ctx, const Tensor& x, const Tensor& xp, int top, int left);
void crop_nhwc(Context& ctx, const Tensor& xp, const Tensor& x, int top, int left);

// dense.cpp (cuBLASLt)
void dense_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act, const Tensor& pre);
void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx);
void dense_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db);

// activation.cu
void activation_forward(Context& ctx, Activation act, const Tensor& x, const Tensor& y);
/// `saved`: the forward output or input, as act.backward_reads() says.
void activation_backward(Context& ctx, Activation act, const Tensor& saved, const Tensor& dy, const Tensor& dx);
void add(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& y);
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
void global_avg_pool_forward(Context& ctx, const Tensor& x, const Tensor& y);
void global_avg_pool_backward(Context& ctx, const Tensor& dy, const Tensor& dx);

// batch_norm.cu
void batch_norm_forward_training(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float momentum, float epsilon, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& saved_mean, const Tensor& saved_invstd,
                                 const Tensor& y);
void batch_norm_forward_inference(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float epsilon,
                                  const Tensor& y);
void batch_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                         const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                         const Tensor& dgamma, const Tensor& dbeta);

// loss.cu
void softmax_cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, float grad_scale,
                           const Tensor& loss_sum_out, const Tensor& correct_out, const Tensor& dlogits,
                           float label_smoothing);
/// The same with grad_scale = step_grad_scale(*state, weight) read on the device (StepState).
void softmax_cross_entropy_scaled(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& state,
                                  double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                  const Tensor& dlogits, float label_smoothing);

// dropout.cu
void dropout_forward(Context& ctx, const Tensor& x, float rate, uint64_t seed, uint64_t offset, const Tensor& mask,
                     const Tensor& y);
void dropout_backward(Context& ctx, const Tensor& dy, const Tensor& mask, float rate, const Tensor& dx);

// optimizer.cu
bool unscale_and_check(Context& ctx, const Tensor& grads, float inv_scale);
void optimizer_step(Context& ctx, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                    const std::vector<Tensor>& states, const Tensor& compute_copy);
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
