// SPDX-License-Identifier: MIT
// dense: y = act(x * W^T + b) with W stored [Cout, Cin]; needs a flat
// per-sample input (after flatten or global_avg_pool).
#include <fmt/format.h>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class Dense : public Layer {
 public:
  Dense(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (in.rank != 1)
      throw ConfigError(fmt::format(
          "{}: dense needs a flat per-sample input but gets {} from the layer before it; add a flatten or "
          "global_avg_pool layer before it",
          where(cfg), in.str()));
    if (cfg.units <= 0) throw ConfigError(fmt::format("{}: units must be positive, got {}", where(cfg), cfg.units));
    const int64_t cin = in[0], cout = cfg.units;
    if (!c.be->supports(Op::Dense, t))
      throw ConfigError(fmt::format("{}: the device ({}) has no {} matrix multiplication. Use policy float32, or "
                                    "dtype: float32 on this layer",
                                    where(cfg), c.be->info().description, dtype_name(t)));
    out_shape_ = Shape{cout};
    kernel_ = c.add_param(name(), "kernel", Shape{cout, cin}, true, Init::Glorot, {ExportLayout::DenseKernel, "weight"},
                          cin, cout);
    param_ids_.push_back(kernel_);
    if (cfg.use_bias) {
      bias_ = c.add_param(name(), "bias", Shape{cout}, true, Init::Zeros, {ExportLayout::AsIs});
      param_ids_.push_back(bias_);
    }
    if (is_16bit(t)) c.need_scratch(cout * cin, cout);
    y_ = c.plan(t, out_shape_, name() + " output", true);
    act_.plan(c, cfg, is_last, t, out_shape_);
  }

  Tensor forward(Context& c, const Tensor& x) override {
    x_ = x;
    const Tensor y = y_.at(x.shape[0]);
    c.be->dense_forward(x, c.weight(kernel_, dtype_), bias_ >= 0 ? c.weight(bias_, dtype_) : Tensor(), y, act_.act,
                        act_.pre_at(c, x.shape[0]));
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    const int64_t n = dy.shape[0];
    const Tensor g = act_.backward(c, y_.at(n), dy);
    weight_grads(c, kernel_, bias_, [&](const Tensor& dw, const Tensor& db) {
      c.be->dense_backward_weights(x_, g, dw, db);
    });
    if (!need_dx) return Tensor();
    const Tensor dx = dx_.at(n);
    c.be->dense_backward_data(g, c.weight(kernel_, dtype_), dx);
    return dx;
  }

 private:
  FusedActivation act_;
  int kernel_ = -1, bias_ = -1;
  Planned y_;
  Tensor x_;
};

}  // namespace

std::unique_ptr<Layer> make_dense(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last) {
  return std::make_unique<Dense>(c, cfg, in, t, depth, is_last);
}

}  // namespace mpx::nn
