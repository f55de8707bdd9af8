// SPDX-License-Identifier: MIT
// dense: y = act(x * W^T + b) with W stored [Cout, Cin]; needs a flat
// per-sample input (after flatten or global_avg_pool).
#include <fmt/format.h>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class Dense : public KernelLayer {
 public:
  Dense(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : KernelLayer(cfg, t, in, depth, c.next_layer_index++) {
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
    add_bias(c, cout, cout * cin);
    plan_output(c, is_last);
  }

  // A float32 dense layer after 16-bit layers reads their output as it is (the dense ops take
  // a 16-bit x and dx with float32 weights: backend/op_table.inc).
  bool reads_input_as(DType t) const override { return dtype_ == DType::F32 && is_16bit(t); }

  // The relu's backward is done with the product (Backend::dense_relu_backward_data;
  // docs/cpu-performance.md, "Relu before a dense layer").
  bool fuse_input_relu() override {
    relu_input_ = true;
    return true;
  }
  bool ends_in_relu() const override { return act_.is_relu(); }
  int64_t input_piece_rows(const Context& c) const override {
    return c.be->dense_input_piece_rows(in_shape_[0], out_shape_[0], dtype_, input_dtype());
  }
  void skip_relu_backward(Context& c) override { act_.hand_backward_to_next(c); }
  // The first convolution's weight gradients in this layer's backward op (Backend::dense_conv_backward;
  // docs/cpu-performance.md, "The first convolution's weight gradient in the dense walk").
  bool takes_conv_weight_grads() const override { return relu_input_ && dtype_ == DType::F32; }
  void backward_with_conv(Context& c, const Tensor& dy, Layer& conv) override {
    const int64_t n = dy.shape[0];
    const Tensor g = act_.backward(c, y_.at(n), dy);
    const Tensor w = c.weight(kernel_, dtype_);
    bool done = false;
    weight_grads(c, kernel_, bias_, [&](const Tensor& dw, const Tensor& db) {
      conv.conv_weight_grads(c, [&](const Conv2dParams& p, const Tensor& cx, const Tensor& cdw, const Tensor& cdb) {
        c.be->dense_conv_backward(x_, g, w, dw, db, dx_.at(n), p, cx, cdw, cdb);
        done = true;
      });
    });
    MPX_CHECK_MSG(done, name() + ": backward_with_conv on a layer that gives no convolution's weight gradients");
  }

 private:
  void run_forward(Context& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                   const Tensor& pre) override {
    c.be->dense_forward(x, w, b, y, act_.act, pre);
  }
  void run_backward_weights(Context& c, const Tensor& x, const Tensor& g, const Tensor& dw,
                            const Tensor& db) override {
    c.be->dense_backward_weights(x, g, dw, db);
  }
  void run_backward_data(Context& c, const Tensor& g, const Tensor& w, const Tensor& dx) override {
    if (relu_input_)
      c.be->dense_relu_backward_data(g, w, x_, dx);
    else
      c.be->dense_backward_data(g, w, dx);
  }
  // Both passes in one op: the backend may walk x once for both (Backend::dense_backward).
  void run_backward(Context& c, const Tensor& x, const Tensor& g, const Tensor& w, const Tensor& dw, const Tensor& db,
                    const Tensor& dx) override {
    c.be->dense_backward(x, g, w, dw, db, dx, relu_input_);
  }

  bool relu_input_ = false;  // x is a relu's output whose gradient this layer computes too
};

}  // namespace

std::unique_ptr<Layer> make_dense(const LayerArgs& a) {
  return std::make_unique<Dense>(a.c, a.cfg, a.in, a.t, a.depth, a.is_last);
}

}  // namespace mpx::nn
