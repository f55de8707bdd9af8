// SPDX-License-Identifier: MIT
// conv2d: NHWC convolution with a [K, R, S, C] kernel, Keras "same"/"valid"
// padding (asymmetric when the total is odd), optional bias, fused activation.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class Conv2d : public Layer {
 public:
  Conv2d(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (in.rank != 3)
      throw ConfigError(fmt::format("{}: conv2d needs a per-sample [H, W, C] input, got {}", where(cfg), in.str()));
    if (cfg.filters <= 0 || cfg.kernel_h <= 0 || cfg.kernel_w <= 0 || cfg.stride_h <= 0 || cfg.stride_w <= 0)
      throw ConfigError(fmt::format("{}: filters ({}), kernel ({}x{}) and strides ({}x{}) must be positive",
                                    where(cfg), cfg.filters, cfg.kernel_h, cfg.kernel_w, cfg.stride_h, cfg.stride_w));
    const int H = static_cast<int>(in[0]), W = static_cast<int>(in[1]);
    const int64_t C = in[2], K = cfg.filters;
    p_.R = cfg.kernel_h;
    p_.S = cfg.kernel_w;
    p_.stride_h = cfg.stride_h;
    p_.stride_w = cfg.stride_w;
    if (cfg.padding == Padding::Same) {  // else valid: no padding
      same_pad(H, p_.R, p_.stride_h, p_.pad_top, p_.pad_bottom);
      same_pad(W, p_.S, p_.stride_w, p_.pad_left, p_.pad_right);
    }
    const int P = p_.out_h(H), Q = p_.out_w(W);  // compare sizes first: the formula truncates toward zero
    if (H + p_.pad_top + p_.pad_bottom < p_.R || W + p_.pad_left + p_.pad_right < p_.S || P <= 0 || Q <= 0)
      throw ConfigError(fmt::format("{}: input {} is smaller than the {}x{} kernel with padding {}", where(cfg),
                                    in.str(), p_.R, p_.S, cfg.padding));
    out_shape_ = Shape{P, Q, K};
    // Accepted (padding same), but the rows and columns past the input only ever meet padding zeros.
    if (p_.R > H || p_.S > W)
      spdlog::warn("{}: the {}x{} kernel is larger than its {}x{} input: part of its weights only ever multiply "
                   "padding zeros; a kernel of at most {}x{} computes the same with fewer parameters",
                   where(cfg), p_.R, p_.S, H, W, std::min(p_.R, H), std::min(p_.S, W));
    // A device that cannot run this convolution in t stops the run here, at start (exit 2).
    const Support s = c.be->supports_conv2d(p_, with_batch(c.max_batch, in), Shape{K, p_.R, p_.S, C}, t);
    if (!s.ok)
      throw ConfigError(fmt::format("{}: the device cannot run this convolution in {}: {}. Use policy float32, or "
                                    "dtype: float32 on this layer",
                                    where(cfg), dtype_name(t), s.reason));
    if (!s.input_grad)
      no_input_grad_ = fmt::format("{}: the device cannot compute this convolution's input gradient in {}: {}. Use "
                                   "policy float32, or dtype: float32 on this layer",
                                   where(cfg), dtype_name(t), s.input_grad_reason);
    const int64_t rs = int64_t{p_.R} * p_.S;
    kernel_ = c.add_param(name(), "kernel", Shape{K, p_.R, p_.S, C}, true, Init::Glorot,
                          {ExportLayout::ConvKernel, "weight"}, rs * C, rs * K);
    param_ids_.push_back(kernel_);
    if (cfg.use_bias) {
      bias_ = c.add_param(name(), "bias", Shape{K}, true, Init::Zeros, {ExportLayout::AsIs});
      param_ids_.push_back(bias_);
    }
    if (is_16bit(t)) c.need_scratch(K * rs * C, K);
    if (cfg.kernel_initializer == KernelInit::Dirac) c.inits[static_cast<size_t>(kernel_)] = Init::Dirac;
    y_ = c.plan(t, out_shape_, name() + " output", true);
    act_.plan(c, cfg, is_last, t, out_shape_);
  }

  // Only a layer whose input gradient is computed (every one but the first) plans it; that is
  // where a device without a backward-data algorithm for this shape stops the run (exit 2).
  void plan_dx(Context& c) override {
    if (!no_input_grad_.empty()) throw ConfigError(no_input_grad_);
    Layer::plan_dx(c);
  }

  bool ends_in_relu() const override { return act_.is_relu(); }
  void skip_relu_backward(Context& c) override { act_.hand_backward_to_next(c); }

  Tensor forward(Context& c, const Tensor& x) override {
    x_ = x;
    const Tensor y = y_.at(x.shape[0]);
    c.be->conv2d_forward(p_, x, c.weight(kernel_, dtype_), bias_ >= 0 ? c.weight(bias_, dtype_) : Tensor(), y,
                         act_.act, act_.pre_at(c, x.shape[0]));
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    const int64_t n = dy.shape[0];
    const Tensor g = act_.backward(c, y_.at(n), dy);
    weight_grads(c, kernel_, bias_, [&](const Tensor& dw, const Tensor& db) {
      c.be->conv2d_backward_filter(p_, x_, g, dw, db);
    });
    if (!need_dx) return Tensor();
    const Tensor dx = dx_.at(n);
    c.be->conv2d_backward_data(p_, g, c.weight(kernel_, dtype_), dx);
    return dx;
  }

 private:
  Conv2dParams p_;
  FusedActivation act_;
  int kernel_ = -1, bias_ = -1;
  Planned y_;
  Tensor x_;
  std::string no_input_grad_;  // why the device cannot run backward data here; empty when it can
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last) {
  return std::make_unique<Conv2d>(c, cfg, in, t, depth, is_last);
}

}  // namespace mpx::nn
