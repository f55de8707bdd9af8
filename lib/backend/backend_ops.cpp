// SPDX-License-Identifier: MIT
// The public compute ops of Backend (convolution, dense, elementwise, pooling,
// batch normalization, loss, dropout, the fused mixed-precision passes): each
// validates its arguments once (backend_checks.h), then calls the backend's *_impl.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/backend_checks.h"
#include "core/error.h"

namespace mpx {

using namespace backend_checks;

// ---- convolution -------------------------------------------------------------

void Backend::conv2d_forward(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& y, Activation act, const Tensor& pre) {
  const char* op = "conv2d_forward";
  require_float(op, "x", x);
  require_data(op, "w", w);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "w", w);
  require_same_dtype(op, "x", x, "y", y);
  check_conv_shapes(op, p, x, "x", w, y, "y");
  check_bias(op, bias, w.shape[0], x.dtype);
  check_activation(op, act);
  check_pre(op, pre, y);
  if (y.numel() == 0) return;
  conv2d_forward_impl(p, x, w, bias, y, act, pre);
}

void Backend::conv2d_backward_data(const Conv2dParams& p, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const char* op = "conv2d_backward_data";
  require_float(op, "dy", dy);
  require_data(op, "w", w);
  require_data(op, "dx", dx);
  require_same_dtype(op, "dy", dy, "w", w);
  require_same_dtype(op, "dy", dy, "dx", dx);
  check_conv_shapes(op, p, dx, "dx", w, dy, "dy");
  if (dx.numel() == 0) return;
  conv2d_backward_data_impl(p, dy, w, dx);
}

void Backend::conv2d_backward_filter(const Conv2dParams& p, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                     const Tensor& db) {
  const char* op = "conv2d_backward_filter";
  require_float(op, "x", x);
  require_data(op, "dy", dy);
  require_data(op, "dw", dw);
  require_same_dtype(op, "x", x, "dy", dy);
  require_grad_dtype(op, "dw", dw, x.dtype);
  check_conv_shapes(op, p, x, "x", dw, dy, "dy");
  if (!db.empty()) {
    require_vector(op, "db", db, dw.shape[0]);
    require_grad_dtype(op, "db", db, x.dtype);
  }
  conv2d_backward_filter_impl(p, x, dy, dw, db);
}

// ---- dense -------------------------------------------------------------------

void Backend::dense_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, Activation act,
                            const Tensor& pre) {
  const char* op = "dense_forward";
  require_float(op, "x", x);
  require_data(op, "w", w);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "w", w);
  require_same_dtype(op, "x", x, "y", y);
  check_dense_shapes(op, x, "x", w, y, "y");
  check_bias(op, bias, w.shape[0], x.dtype);
  check_activation(op, act);
  check_pre(op, pre, y);
  dense_forward_impl(x, w, bias, y, act, pre);
}

void Backend::dense_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const char* op = "dense_backward_data";
  require_float(op, "dy", dy);
  require_data(op, "w", w);
  require_data(op, "dx", dx);
  require_same_dtype(op, "dy", dy, "w", w);
  require_same_dtype(op, "dy", dy, "dx", dx);
  check_dense_shapes(op, dx, "dx", w, dy, "dy");
  dense_backward_data_impl(dy, w, dx);
}

void Backend::dense_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  const char* op = "dense_backward_weights";
  require_float(op, "x", x);
  require_data(op, "dy", dy);
  require_data(op, "dw", dw);
  require_same_dtype(op, "x", x, "dy", dy);
  require_grad_dtype(op, "dw", dw, x.dtype);
  check_dense_shapes(op, x, "x", dw, dy, "dy");
  if (!db.empty()) {
    require_vector(op, "db", db, dw.shape[0]);
    require_grad_dtype(op, "db", db, x.dtype);
  }
  dense_backward_weights_impl(x, dy, dw, db);
}

// ---- elementwise -------------------------------------------------------------

void Backend::activation_forward(Activation act, const Tensor& x, const Tensor& y) {
  const char* op = "activation_forward";
  require_float(op, "x", x);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "y", y);
  require_same_numel(op, "x", x, "y", y);
  check_activation(op, act);
  if (x.numel() == 0) return;
  activation_forward_impl(act, x, y);
}

void Backend::activation_backward(Activation act, const Tensor& saved, const Tensor& dy, const Tensor& dx) {
  const char* op = "activation_backward";
  require_float(op, "saved", saved);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "saved", saved, "dy", dy);
  require_same_dtype(op, "saved", saved, "dx", dx);
  require_same_numel(op, "saved", saved, "dy", dy);
  require_same_numel(op, "saved", saved, "dx", dx);
  check_activation(op, act);
  if (saved.numel() == 0) return;
  activation_backward_impl(act, saved, dy, dx);
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  const char* op = "add";
  require_float(op, "a", a);
  require_data(op, "b", b);
  require_data(op, "y", y);
  require_same_dtype(op, "a", a, "b", b);
  require_same_dtype(op, "a", a, "y", y);
  require_same_shape(op, "a", a, "b", b);
  require_same_numel(op, "a", a, "y", y);
  if (a.numel() == 0) return;
  add_impl(a, b, y);
}

// ---- pooling -----------------------------------------------------------------

bool Backend::max_pool_keeps_argmax(const PoolParams& p, const Shape& x) const {
  return p.kind == PoolKind::Max && max_pool_keeps_argmax_impl(p, x);
}

namespace {
/// An argmax tensor for y: uint8, y's shape, of a geometry whose argmax the backend keeps.
void check_argmax(const char* op, const Backend& be, const PoolParams& p, const Tensor& x, const Tensor& y,
                  const Tensor& argmax) {
  require_data(op, "argmax", argmax);
  MPX_VALIDATE(argmax.dtype == DType::U8, "{}: argmax must be uint8, got {}", op, dtype_name(argmax.dtype));
  require_same_shape(op, "y", y, "argmax", argmax);
  MPX_VALIDATE(be.max_pool_keeps_argmax(p, x.shape), "{}: this backend keeps no argmax for {}x{} {} pooling of x {}",
               op, p.R, p.S, p.kind == PoolKind::Max ? "max" : "average", x.str());
}
}  // namespace

void Backend::pool_forward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& argmax) {
  check_pool_shapes("pool_forward", p, x, y);
  if (!argmax.empty()) check_argmax("pool_forward", *this, p, x, y, argmax);
  if (y.numel() == 0) return;
  if (argmax.empty())
    pool_forward_impl(p, x, y);
  else
    max_pool_forward_argmax_impl(p, x, y, argmax);
}

void Backend::max_pool_forward_argmax_impl(const PoolParams&, const Tensor&, const Tensor&, const Tensor&) {
  MPX_VALIDATE(false, "pool_forward: this backend keeps no max-pooling argmax");
}

void Backend::max_pool_backward_argmax_impl(const PoolParams&, const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, bool) {
  MPX_VALIDATE(false, "pool_backward: this backend keeps no max-pooling argmax");
}

namespace {
/// The arguments of a pooling backward op: x/y as the forward's, dy like y, dx like x.
void check_pool_backward(const char* op, const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                         const Tensor& dx) {
  check_pool_shapes(op, p, x, y);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "x", x, "dy", dy);
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "y", y, "dy", dy);
  require_same_shape(op, "x", x, "dx", dx);
}
}  // namespace

void Backend::pool_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                            const Tensor& dx, const Tensor& argmax) {
  check_pool_backward("pool_backward", p, x, y, dy, dx);
  if (!argmax.empty()) check_argmax("pool_backward", *this, p, x, y, argmax);
  if (dx.numel() == 0) return;
  if (argmax.empty())
    pool_backward_impl(p, x, y, dy, dx);
  else
    max_pool_backward_argmax_impl(p, y, argmax, dy, dx, false);
}

void Backend::max_pool_relu_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& dx, const Tensor& argmax) {
  const char* op = "max_pool_relu_backward";
  MPX_VALIDATE(p.kind == PoolKind::Max, "{}: needs max pooling, got average", op);
  check_pool_backward(op, p, x, y, dy, dx);
  if (!argmax.empty()) check_argmax(op, *this, p, x, y, argmax);
  if (dx.numel() == 0) return;
  if (argmax.empty())
    max_pool_relu_backward_impl(p, x, y, dy, dx);
  else
    max_pool_backward_argmax_impl(p, y, argmax, dy, dx, true);
}

void Backend::max_pool_relu_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                          const Tensor& dx) {
  pool_backward_impl(p, x, y, dy, dx);
  activation_backward_impl(Activation::Relu, x, dx, dx);
}

void Backend::global_avg_pool_forward(const Tensor& x, const Tensor& y) {
  const char* op = "global_avg_pool_forward";
  require_float(op, "x", x);
  require_data(op, "y", y);
  require_rank(op, "x", x, 4);
  require_same_dtype(op, "x", x, "y", y);
  require_shape(op, "y", y, Shape{x.shape[0], x.shape[3]});
  MPX_VALIDATE(x.shape[1] * x.shape[2] > 0, "{}: x {} has no pixels", op, x.str());
  if (y.numel() == 0) return;
  global_avg_pool_forward_impl(x, y);
}

void Backend::global_avg_pool_backward(const Tensor& dy, const Tensor& dx) {
  const char* op = "global_avg_pool_backward";
  require_float(op, "dy", dy);
  require_data(op, "dx", dx);
  require_rank(op, "dx", dx, 4);
  require_same_dtype(op, "dy", dy, "dx", dx);
  require_shape(op, "dy", dy, Shape{dx.shape[0], dx.shape[3]});
  MPX_VALIDATE(dx.shape[1] * dx.shape[2] > 0, "{}: dx {} has no pixels", op, dx.str());
  if (dx.numel() == 0) return;
  global_avg_pool_backward_impl(dy, dx);
}

// ---- batch normalization -----------------------------------------------------

namespace {
int64_t bn_channels(const char* op, const Tensor& x) {
  MPX_VALIDATE(x.shape.rank == 4 || x.shape.rank == 2, "{}: x must be [N, H, W, C] or [N, C], got {}", op,
               x.str());
  return x.shape[x.shape.rank - 1];
}
void require_param(const char* op, const char* name, const Tensor& t, int64_t c) {
  require_f32(op, name, t);
  require_vector(op, name, t, c);
}
}  // namespace

void Backend::batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, float momentum,
                                          float epsilon, const Tensor& running_mean, const Tensor& running_var,
                                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& y) {
  const char* op = "batch_norm_forward_training";
  require_float(op, "x", x);
  const int64_t c = bn_channels(op, x);
  require_param(op, "gamma", gamma, c);
  require_param(op, "beta", beta, c);
  require_param(op, "running_mean", running_mean, c);
  require_param(op, "running_var", running_var, c);
  require_param(op, "saved_mean", saved_mean, c);
  require_param(op, "saved_invstd", saved_invstd, c);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "y", y);
  require_same_shape(op, "x", x, "y", y);
  MPX_VALIDATE(epsilon > 0 && momentum >= 0 && momentum <= 1, "{}: epsilon {} must be > 0, momentum {} in [0, 1]",
               op, epsilon, momentum);
  MPX_VALIDATE(x.numel() > 0, "{}: empty batch {}", op, x.str());
  batch_norm_forward_training_impl(x, gamma, beta, momentum, epsilon, running_mean, running_var, saved_mean,
                                   saved_invstd, y);
}

void Backend::batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                           const Tensor& running_mean, const Tensor& running_var, float epsilon,
                                           const Tensor& y) {
  const char* op = "batch_norm_forward_inference";
  require_float(op, "x", x);
  const int64_t c = bn_channels(op, x);
  require_param(op, "gamma", gamma, c);
  require_param(op, "beta", beta, c);
  require_param(op, "running_mean", running_mean, c);
  require_param(op, "running_var", running_var, c);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "y", y);
  require_same_shape(op, "x", x, "y", y);
  MPX_VALIDATE(epsilon > 0, "{}: epsilon {} must be > 0", op, epsilon);
  if (x.numel() == 0) return;
  batch_norm_forward_inference_impl(x, gamma, beta, running_mean, running_var, epsilon, y);
}

void Backend::batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& saved_mean,
                                  const Tensor& saved_invstd, const Tensor& dx, const Tensor& dgamma,
                                  const Tensor& dbeta) {
  const char* op = "batch_norm_backward";
  require_float(op, "x", x);
  const int64_t c = bn_channels(op, x);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "x", x, "dy", dy);
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "x", x, "dy", dy);
  require_same_shape(op, "x", x, "dx", dx);
  require_param(op, "gamma", gamma, c);
  require_param(op, "saved_mean", saved_mean, c);
  require_param(op, "saved_invstd", saved_invstd, c);
  require_param(op, "dgamma", dgamma, c);
  require_param(op, "dbeta", dbeta, c);
  MPX_VALIDATE(x.numel() > 0, "{}: empty batch {}", op, x.str());
  batch_norm_backward_impl(x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

// ---- loss --------------------------------------------------------------------


void Backend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                    const Tensor& loss_sum_out, const Tensor& correct_out, const Tensor& dlogits,
                                    float label_smoothing) {
  require_softmax_args("softmax_cross_entropy", logits, labels, loss_sum_out, correct_out, dlogits, label_smoothing);
  softmax_cross_entropy_impl(logits, labels, grad_scale, loss_sum_out, correct_out, dlogits, label_smoothing);
}

// ---- dropout -----------------------------------------------------------------

void Backend::dropout_forward(const Tensor& x, float rate, uint64_t seed, uint64_t offset, const Tensor& mask,
                              const Tensor& y) {
  const char* op = "dropout_forward";
  require_float(op, "x", x);
  require_data(op, "y", y);
  require_data(op, "mask", mask);
  require_same_dtype(op, "x", x, "y", y);
  require_same_numel(op, "x", x, "y", y);
  require_same_numel(op, "x", x, "mask", mask);
  MPX_VALIDATE(mask.dtype == DType::U8, "{}: mask must be uint8, got {}", op, mask.str());
  MPX_VALIDATE(rate >= 0.0f && rate < 1.0f, "{}: rate {} must be in [0, 1)", op, rate);
  if (x.numel() == 0) return;
  dropout_forward_impl(x, rate, seed, offset, mask, y);
}

void Backend::dropout_backward(const Tensor& dy, const Tensor& mask, float rate, const Tensor& dx) {
  const char* op = "dropout_backward";
  require_float(op, "dy", dy);
  require_data(op, "dx", dx);
  require_data(op, "mask", mask);
  require_same_dtype(op, "dy", dy, "dx", dx);
  require_same_numel(op, "dy", dy, "dx", dx);
  require_same_numel(op, "dy", dy, "mask", mask);
  MPX_VALIDATE(mask.dtype == DType::U8, "{}: mask must be uint8, got {}", op, mask.str());
  MPX_VALIDATE(rate >= 0.0f && rate < 1.0f, "{}: rate {} must be in [0, 1)", op, rate);
  if (dy.numel() == 0) return;
  dropout_backward_impl(dy, mask, rate, dx);
}

// ---- fused mixed-precision passes --------------------------------------------

bool Backend::unscale_and_check(const Tensor& grads, float inv_scale) {
  require_f32("unscale_and_check", "grads", grads);
  if (grads.numel() == 0) return true;
  return unscale_and_check_impl(grads, inv_scale);
}


void Backend::optimizer_step(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                             const std::vector<Tensor>& states, const Tensor& compute_copy) {
  const char* op = "optimizer_step";
  require_optimizer_args(op, s, master, grads, states, compute_copy);
  if (optimizer_info(s.kind).bias_corrected) {
    MPX_VALIDATE(s.t >= 1, "{}: Adam step t={} must be >= 1", op, s.t);
  }
  if (master.numel() == 0) return;
  optimizer_step_impl(s, master, grads, states, compute_copy);
}

}  // namespace mpx
