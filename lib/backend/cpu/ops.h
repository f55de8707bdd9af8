// SPDX-License-Identifier: MIT
// The CPU backend's operations (namespace mpx::cpu), one group per file with
// the same names as lib/backend/cuda/. Inputs are already validated by
// Backend's public methods (backend.cpp). 16-bit contract: operands are read as
// 16-bit values, math is float32 with float32 accumulation, each 16-bit output
// is rounded to nearest-even once from its float32 result.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/context.h"

namespace mpx::cpu {

// memory.cpp
void fill(const Tensor& dst, float value);
void copy(const Tensor& dst, const Tensor& src);

// cast.cpp
void cast(const Tensor& src, const Tensor& dst);
void normalize_input(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& std, const Tensor& y);

// conv.cpp
void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre);
void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w, const Tensor& dx);
void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db);

// dense.cpp
void dense_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act, const Tensor& pre);
void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx);
void dense_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db);

// activation.cpp
void activation_forward(Activation act, const Tensor& x, const Tensor& y);
void activation_backward(Activation act, const Tensor& saved, const Tensor& dy, const Tensor& dx);
/// The end of a fused conv/dense: z (float32, y.numel() elements) holds the pre-activation, in
/// y's own memory when y is float32 (f32_out). In one pass: pre (when not empty) = z rounded to
/// its dtype, then y = act(z) rounded to y's dtype. z is overwritten.
void activation_epilogue(Activation act, float* z, const Tensor& y, const Tensor& pre);
void add(const Tensor& a, const Tensor& b, const Tensor& y);

// pool.cpp
void pool_forward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y);
/// relu_input (max pooling only): x is a relu's output, and dx is also that relu's gradient.
void pool_backward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                   const Tensor& dx, bool relu_input = false);
/// Max pooling that keeps each output's window position (Backend::max_pool_keeps_argmax):
/// the tiled geometries, where the kernels are mpx's own.
bool max_pool_keeps_argmax(const PoolParams& p, const Shape& x);
void max_pool_forward_argmax(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& argmax);
void max_pool_backward_argmax(const PoolParams& p, const Tensor& y, const Tensor& argmax, const Tensor& dy,
                              const Tensor& dx, bool relu_input);
void global_avg_pool_forward(Context& ctx, const Tensor& x, const Tensor& y);
void global_avg_pool_backward(Context& ctx, const Tensor& dy, const Tensor& dx);

// batch_norm.cpp
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

// loss.cpp
void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, const Tensor& loss_sum_out,
                           const Tensor& correct_out, const Tensor& dlogits, float label_smoothing);

// dropout.cpp
void dropout_forward(const Tensor& x, float rate, uint64_t seed, uint64_t offset, const Tensor& mask,
                     const Tensor& y);
void dropout_backward(const Tensor& dy, const Tensor& mask, float rate, const Tensor& dx);

// optimizer.cpp
bool unscale_and_check(const Tensor& grads, float inv_scale);
void optimizer_step(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                    const std::vector<Tensor>& states, const Tensor& compute_copy);
TensorStats stats(const Tensor& x);

}  // namespace mpx::cpu
