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

class Conv2d : public KernelLayer {
 public:
  Conv2d(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : KernelLayer(cfg, t, in, depth, c.next_layer_index++), p_(conv_window(cfg, in, "filters", cfg.filters)) {
    const int H = static_cast<int>(in[0]), W = static_cast<int>(in[1]);
    const int64_t C = in[2], K = cfg.filters;
    out_shape_ = Shape{p_.out_h(H), p_.out_w(W), K};
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
    add_bias(c, K, K * rs * C);
    if (cfg.kernel_initializer == KernelInit::Dirac) c.inits[static_cast<size_t>(kernel_)] = Init::Dirac;
    plan_output(c, is_last);
  }

  // Only a layer whose input gradient is computed (every one but the first) plans it; that is
  // where a device without a backward-data algorithm for this shape stops the run (exit 2).
  void plan_dx(Context& c) override {
    if (!no_input_grad_.empty()) throw ConfigError(no_input_grad_);
    Layer::plan_dx(c);
  }

  bool ends_in_relu() const override { return act_.is_relu(); }
  void skip_relu_backward(Context& c) override { act_.hand_backward_to_next(c); }
  bool gives_conv_weight_grads() const override { return act_.backward_by_next; }
  void conv_weight_grads(
      Context& c,
      const std::function<void(const Conv2dParams&, const Tensor&, const Tensor&, const Tensor&)>& fn) override {
    weight_grads(c, kernel_, bias_, [&](const Tensor& dw, const Tensor& db) { fn(p_, x_, dw, db); });
  }
  const Conv2dParams* conv_forward_window() const override { return act_.backward_by_next ? &p_ : nullptr; }
  void conv_forward_args(Context& c, int64_t n,
                         const std::function<void(const Tensor&, const Tensor&, const Tensor&)>& fn) override {
    fn(c.weight(kernel_, dtype_), bias_ >= 0 ? c.weight(bias_, dtype_) : Tensor(), y_.at(n));
  }
  bool forwards_by_rows(const Context& c) const override {
    return c.be->conv2d_forward_in_pieces(p_, with_batch(1, in_shape_),
                                          Shape{out_shape_[2], p_.R, p_.S, in_shape_[2]}, dtype_);
  }

 private:
  void run_forward(Context& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                   const Tensor& pre) override {
    c.be->conv2d_forward(p_, x, w, b, y, act_.act, pre);
  }
  void run_backward_weights(Context& c, const Tensor& x, const Tensor& g, const Tensor& dw,
                            const Tensor& db) override {
    c.be->conv2d_backward_filter(p_, x, g, dw, db);
  }
  void run_backward_data(Context& c, const Tensor& g, const Tensor& w, const Tensor& dx) override {
    c.be->conv2d_backward_data(p_, g, w, dx);
  }

  Conv2dParams p_;
  std::string no_input_grad_;  // why the device cannot run backward data here; empty when it can
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(const LayerArgs& a) {
  return std::make_unique<Conv2d>(a.c, a.cfg, a.in, a.t, a.depth, a.is_last);
}

}  // namespace mpx::nn
