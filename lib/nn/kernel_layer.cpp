// SPDX-License-Identifier: MIT
// What conv2d, depthwise_conv2d and dense share (nn/layer.h's KernelLayer, conv_window).
#include <fmt/format.h>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

void KernelLayer::add_bias(Context& c, int64_t units, int64_t kernel_numel) {
  if (cfg_.use_bias) {
    bias_ = c.add_param(name(), "bias", Shape{units}, true, Init::Zeros, {ExportLayout::AsIs});
    param_ids_.push_back(bias_);
  }
  if (is_16bit(dtype_)) c.need_scratch(kernel_numel, units);
}

void KernelLayer::plan_output(Context& c, bool is_last) {
  y_ = c.plan(dtype_, out_shape_, name() + " output", true);
  act_.plan(c, cfg_, is_last, dtype_, out_shape_);
}

Tensor KernelLayer::forward(Context& c, const Tensor& x) {
  forward_rows(c, x, 0, x.shape[0]);  // all rows: the whole output
  return forward_rows_done(x);
}

Tensor KernelLayer::forward_rows(Context& c, const Tensor& x, int64_t begin, int64_t n) {
  const int64_t k = x.shape[0];
  const Tensor y = y_.at(n).slice_rows(begin, k);
  Tensor pre = act_.pre_at(c, n);
  if (!pre.empty()) pre = pre.slice_rows(begin, k);
  run_forward(c, x, c.weight(kernel_, dtype_), bias_ >= 0 ? c.weight(bias_, dtype_) : Tensor(), y, pre);
  return y;
}

Tensor KernelLayer::forward_rows_done(const Tensor& x) {
  x_ = x;
  return y_.at(x.shape[0]);
}

Tensor KernelLayer::backward(Context& c, const Tensor& dy, bool need_dx) {
  const int64_t n = dy.shape[0];
  const Tensor g = act_.backward(c, y_.at(n), dy);
  const Tensor dx = need_dx ? dx_.at(n) : Tensor();
  weight_grads(c, kernel_, bias_, [&](const Tensor& dw, const Tensor& db) {
    if (need_dx)
      run_backward(c, x_, g, c.weight(kernel_, dtype_), dw, db, dx);
    else
      run_backward_weights(c, x_, g, dw, db);
  });
  return dx;
}

void KernelLayer::run_backward(Context& c, const Tensor& x, const Tensor& g, const Tensor& w, const Tensor& dw,
                               const Tensor& db, const Tensor& dx) {
  run_backward_weights(c, x, g, dw, db);
  run_backward_data(c, g, w, dx);
}

Conv2dParams conv_window(const LayerConfig& cfg, Shape in, const char* count_key, int64_t count) {
  const char* type = enum_name(cfg.type);
  if (in.rank != 3)
    throw ConfigError(fmt::format("{}: {} needs a per-sample [H, W, C] input, got {}", where(cfg), type, in.str()));
  if (count <= 0 || cfg.kernel_h <= 0 || cfg.kernel_w <= 0 || cfg.stride_h <= 0 || cfg.stride_w <= 0)
    throw ConfigError(fmt::format("{}: {} ({}), kernel ({}x{}) and strides ({}x{}) must be positive", where(cfg),
                                  count_key, count, cfg.kernel_h, cfg.kernel_w, cfg.stride_h, cfg.stride_w));
  const int H = static_cast<int>(in[0]), W = static_cast<int>(in[1]);
  Conv2dParams p;
  p.R = cfg.kernel_h;
  p.S = cfg.kernel_w;
  p.stride_h = cfg.stride_h;
  p.stride_w = cfg.stride_w;
  if (cfg.padding == Padding::Same) {  // else valid: no padding
    same_pad(H, p.R, p.stride_h, p.pad_top, p.pad_bottom);
    same_pad(W, p.S, p.stride_w, p.pad_left, p.pad_right);
  }
  const int P = p.out_h(H), Q = p.out_w(W);  // compare sizes first: the formula truncates toward zero
  if (H + p.pad_top + p.pad_bottom < p.R || W + p.pad_left + p.pad_right < p.S || P <= 0 || Q <= 0)
    throw ConfigError(fmt::format("{}: input {} is smaller than the {}x{} kernel with padding {}", where(cfg), in.str(),
                                  p.R, p.S, cfg.padding));
  return p;
}

}  // namespace mpx::nn
