// SPDX-License-Identifier: MIT
// depthwise_conv2d (Keras DepthwiseConv2D): one R x S filter per input channel and
// output (depth_multiplier M of them), NHWC, Keras "same"/"valid" padding, optional bias,
// fused activation. Its kernel is [C*M, R, S, 1]: output channel c*M + m filters input
// channel c, as Keras and PyTorch (groups = C) number them.
#include <fmt/format.h>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class DepthwiseConv2d : public Layer {
 public:
  DepthwiseConv2d(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (in.rank != 3)
      throw ConfigError(
          fmt::format("{}: depthwise_conv2d needs a per-sample [H, W, C] input, got {}", where(cfg), in.str()));
    if (cfg.depth_multiplier <= 0 || cfg.kernel_h <= 0 || cfg.kernel_w <= 0 || cfg.stride_h <= 0 || cfg.stride_w <= 0)
      throw ConfigError(fmt::format("{}: depth_multiplier ({}), kernel ({}x{}) and strides ({}x{}) must be positive",
                                    where(cfg), cfg.depth_multiplier, cfg.kernel_h, cfg.kernel_w, cfg.stride_h,
                                    cfg.stride_w));
    const int H = static_cast<int>(in[0]), W = static_cast<int>(in[1]);
    const int64_t C = in[2], M = cfg.depth_multiplier, K = C * M;
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
    if (!c.be->supports(Op::Conv2d, t))
      throw ConfigError(fmt::format("{}: the device has no {} convolutions. Use policy float32, or dtype: float32 "
                                    "on this layer",
                                    where(cfg), dtype_name(t)));
    out_shape_ = Shape{P, Q, K};
    // The export layouts (weights/weights.h) of the [C*M, R, S, 1] kernel, seen as [C, M, R, S]:
    // Keras' depthwise_kernel [R, S, C, M]; PyTorch's groups=C weight [C*M, 1, R, S].
    const ExportAxes keras{Shape{C, M, p_.R, p_.S}, {2, 3, 0, 1}};
    const ExportAxes torch{Shape{K, p_.R, p_.S, 1}, {0, 3, 1, 2}};
    const int64_t rs = int64_t{p_.R} * p_.S;
    // Keras' glorot_uniform of a [R, S, C, M] kernel: fan_in R*S*C, fan_out R*S*M.
    kernel_ = c.add_param(name(), "depthwise_kernel", Shape{K, p_.R, p_.S, 1}, true, Init::Glorot,
                          {ExportLayout::Permuted, "weight", keras, torch}, rs * C, rs * M);
    param_ids_.push_back(kernel_);
    if (cfg.use_bias) {
      bias_ = c.add_param(name(), "bias", Shape{K}, true, Init::Zeros, {ExportLayout::AsIs});
      param_ids_.push_back(bias_);
    }
    if (is_16bit(t)) c.need_scratch(K * rs, K);
    y_ = c.plan(t, out_shape_, name() + " output", true);
    act_.plan(c, cfg, is_last, t, out_shape_);
  }

  bool ends_in_relu() const override { return act_.is_relu(); }
  void skip_relu_backward(Context& c) override { act_.hand_backward_to_next(c); }

  Tensor forward(Context& c, const Tensor& x) override {
    x_ = x;
    const Tensor y = y_.at(x.shape[0]);
    c.be->depthwise_conv2d_forward(p_, x, c.weight(kernel_, dtype_),
                                   bias_ >= 0 ? c.weight(bias_, dtype_) : Tensor(), y, act_.act,
                                   act_.pre_at(c, x.shape[0]));
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    const int64_t n = dy.shape[0];
    const Tensor g = act_.backward(c, y_.at(n), dy);
    weight_grads(c, kernel_, bias_, [&](const Tensor& dw, const Tensor& db) {
      c.be->depthwise_conv2d_backward_filter(p_, x_, g, dw, db);
    });
    if (!need_dx) return Tensor();
    const Tensor dx = dx_.at(n);
    c.be->depthwise_conv2d_backward_data(p_, g, c.weight(kernel_, dtype_), dx);
    return dx;
  }

 private:
  Conv2dParams p_;
  FusedActivation act_;
  int kernel_ = -1, bias_ = -1;
  Planned y_;
  Tensor x_;
};

}  // namespace

std::unique_ptr<Layer> make_depthwise_conv2d(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth,
                                             bool is_last) {
  return std::make_unique<DepthwiseConv2d>(c, cfg, in, t, depth, is_last);
}

}  // namespace mpx::nn
