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

class DepthwiseConv2d : public KernelLayer {
 public:
  DepthwiseConv2d(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : KernelLayer(cfg, t, in, depth, c.next_layer_index++),
        p_(conv_window(cfg, in, "depth_multiplier", cfg.depth_multiplier)) {
    if (!c.be->supports(Op::Conv2d, t))
      throw ConfigError(fmt::format("{}: the device has no {} convolutions. Use policy float32, or dtype: float32 "
                                    "on this layer",
                                    where(cfg), dtype_name(t)));
    const int64_t C = in[2], M = cfg.depth_multiplier, K = C * M;
    out_shape_ = Shape{p_.out_h(static_cast<int>(in[0])), p_.out_w(static_cast<int>(in[1])), K};
    // The export layouts (weights/weights.h) of the [C*M, R, S, 1] kernel, seen as [C, M, R, S]:
    // Keras' depthwise_kernel [R, S, C, M]; PyTorch's groups=C weight [C*M, 1, R, S].
    const ExportAxes keras{Shape{C, M, p_.R, p_.S}, {2, 3, 0, 1}};
    const ExportAxes torch{Shape{K, p_.R, p_.S, 1}, {0, 3, 1, 2}};
    const int64_t rs = int64_t{p_.R} * p_.S;
    // Keras' glorot_uniform of a [R, S, C, M] kernel: fan_in R*S*C, fan_out R*S*M.
    kernel_ = c.add_param(name(), "depthwise_kernel", Shape{K, p_.R, p_.S, 1}, true, Init::Glorot,
                          {ExportLayout::Permuted, "weight", keras, torch}, rs * C, rs * M);
    param_ids_.push_back(kernel_);
    add_bias(c, K, K * rs);
    plan_output(c, is_last);
  }

  bool ends_in_relu() const override { return act_.is_relu(); }
  void skip_relu_backward(Context& c) override { act_.hand_backward_to_next(c); }

 private:
  void run_forward(Context& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                   const Tensor& pre) override {
    c.be->depthwise_conv2d_forward(p_, x, w, b, y, act_.act, pre);
  }
  void run_backward_weights(Context& c, const Tensor& x, const Tensor& g, const Tensor& dw,
                            const Tensor& db) override {
    c.be->depthwise_conv2d_backward_filter(p_, x, g, dw, db);
  }
  void run_backward_data(Context& c, const Tensor& g, const Tensor& w, const Tensor& dx) override {
    c.be->depthwise_conv2d_backward_data(p_, g, w, dx);
  }

  Conv2dParams p_;
};

}  // namespace

std::unique_ptr<Layer> make_depthwise_conv2d(const LayerArgs& a) {
  return std::make_unique<DepthwiseConv2d>(a.c, a.cfg, a.in, a.t, a.depth, a.is_last);
}

}  // namespace mpx::nn
