// SPDX-License-Identifier: MIT
// Pooling layers: max_pool / avg_pool (window, stride, Keras padding; average
// excludes padding) and global_avg_pool ([H, W, C] -> [C]).
#include <fmt/format.h>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class Pool : public Layer {
 public:
  Pool(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (in.rank != 3)
      throw ConfigError(fmt::format("{}: {} needs a per-sample [H, W, C] input, got {}", where(cfg), cfg.type,
                                    in.str()));
    p_.kind = cfg.type == LayerType::MaxPool ? PoolKind::Max : PoolKind::Avg;
    p_.R = cfg.pool_h;
    p_.S = cfg.pool_w;
    p_.stride_h = cfg.pool_stride_h > 0 ? cfg.pool_stride_h : cfg.pool_h;
    p_.stride_w = cfg.pool_stride_w > 0 ? cfg.pool_stride_w : cfg.pool_w;
    if (p_.R <= 0 || p_.S <= 0 || p_.stride_h <= 0 || p_.stride_w <= 0)
      throw ConfigError(fmt::format("{}: pool size ({}x{}) and strides ({}x{}) must be positive", where(cfg), p_.R,
                                    p_.S, p_.stride_h, p_.stride_w));
    const int H = static_cast<int>(in[0]), W = static_cast<int>(in[1]);
    if (cfg.padding == Padding::Same) {  // else valid: no padding
      same_pad(H, p_.R, p_.stride_h, p_.pad_top, p_.pad_bottom);
      same_pad(W, p_.S, p_.stride_w, p_.pad_left, p_.pad_right);
    }
    // The window must fit the (padded) input: with strides above 1 the output
    // size formula truncates toward zero and would give 1 for a window that
    // hangs past the input, so the sizes are compared first.
    const int P = p_.out_h(H), Q = p_.out_w(W);
    if (H + p_.pad_top + p_.pad_bottom < p_.R || W + p_.pad_left + p_.pad_right < p_.S || P <= 0 || Q <= 0)
      throw ConfigError(fmt::format("{}: input {} is smaller than the {}x{} pool window with padding {}", where(cfg),
                                    in.str(), p_.R, p_.S, cfg.padding));
    out_shape_ = Shape{P, Q, in[2]};
    y_ = c.plan(t, out_shape_, name() + " output", true);
    // Max pooling whose window positions the backend keeps: the backward reads them
    // instead of searching the input again.
    if (c.be->max_pool_keeps_argmax(p_, Shape{1, in[0], in[1], in[2]}))
      argmax_ = c.plan(DType::U8, out_shape_, name() + " argmax", true);
  }

  bool fuse_input_relu() override {
    relu_input_ = p_.kind == PoolKind::Max;
    return relu_input_;
  }

  Tensor forward(Context& c, const Tensor& x) override {
    forward_rows(c, x, 0, x.shape[0]);  // all rows: the whole output
    return forward_rows_done(x);
  }

  // In pieces of the batch (docs/cpu-performance.md, "Pieces of the batch"): a max pooling on
  // the backend's own kernels, the ones that keep the window positions.
  bool forwards_by_rows(const Context&) const override { return !argmax_.empty(); }
  int64_t input_piece_rows(const Context& c) const override {
    return c.be->max_pool_input_piece_rows(p_, with_batch(1, in_shape_), dtype_);
  }
  Tensor forward_rows(Context& c, const Tensor& x, int64_t begin, int64_t n) override {
    const int64_t k = x.shape[0];
    const Tensor y = y_.at(n).slice_rows(begin, k);
    argmax_kept_ = c.training && !argmax_.empty();  // only a training step's backward reads it
    c.be->pool_forward(p_, x, y, argmax_kept_ ? argmax_.at(n).slice_rows(begin, k) : Tensor());
    return y;
  }
  Tensor forward_rows_done(const Tensor& x) override {
    x_ = x;
    return y_.at(x.shape[0]);
  }

  // The convolution's forward in this layer's forward op (Backend::conv_max_pool_forward;
  // docs/cpu-performance.md, "The first convolution's forward with max pooling"): a training
  // step's backward then routes dy from the argmax and reads neither the convolution's output nor
  // the relu's; an evaluation keeps no argmax.
  bool takes_conv_forward(const Context& c, const Layer& conv) const override {
    const Conv2dParams* cp = conv.conv_forward_window();
    const Shape ci = conv.in_shape(), co = conv.out_shape();
    return relu_input_ && !argmax_.empty() && cp && conv.dtype() == dtype_ &&
           c.be->conv_max_pool_forward_fuses(*cp, with_batch(1, ci), Shape{co[2], cp->R, cp->S, ci[2]}, dtype_, p_);
  }
  Tensor forward_with_conv(Context& c, const Tensor& x, Layer& conv) override {
    const int64_t n = x.shape[0];
    MPX_CHECK(conv.conv_forward_window() && !argmax_.empty());
    const Tensor y = y_.at(n), argmax = c.training ? argmax_.at(n) : Tensor();
    conv.conv_forward_args(c, n, [&](const Tensor& w, const Tensor& b, const Tensor& conv_y) {
      c.be->conv_max_pool_forward(*conv.conv_forward_window(), x, w, b, conv_y, p_, y, argmax);
      x_ = conv_y;  // its shape for the backward's checks; its contents are not read
    });
    argmax_kept_ = c.training;
    conv.forward_rows_done(x);
    return y;
  }

  // The first convolution's weight gradients in this layer's backward op
  // (Backend::max_pool_conv_backward; docs/cpu-performance.md, "Max pooling's backward in the
  // first convolution's weight gradient").
  bool takes_conv_weight_grads() const override { return relu_input_; }
  void backward_with_conv(Context& c, const Tensor& dy, Layer& conv) override {
    const int64_t n = dy.shape[0];
    const Tensor argmax = argmax_kept_ ? argmax_.at(n) : Tensor();
    bool done = false;
    conv.conv_weight_grads(c, [&](const Conv2dParams& p, const Tensor& cx, const Tensor& cdw, const Tensor& cdb) {
      c.be->max_pool_conv_backward(p_, x_, y_.at(n), dy, dx_.at(n), argmax, p, cx, cdw, cdb);
      done = true;
    });
    MPX_CHECK_MSG(done, name() + ": backward_with_conv on a layer that gives no convolution's weight gradients");
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    const Tensor dx = dx_.at(dy.shape[0]);
    const Tensor argmax = argmax_kept_ ? argmax_.at(dy.shape[0]) : Tensor();
    if (relu_input_)
      c.be->max_pool_relu_backward(p_, x_, y_.at(dy.shape[0]), dy, dx, argmax);
    else
      c.be->pool_backward(p_, x_, y_.at(dy.shape[0]), dy, dx, argmax);
    return dx;
  }

 private:
  PoolParams p_;
  bool relu_input_ = false;  // x is a relu's output whose gradient this layer computes too
  Planned y_;
  Planned argmax_;            // uint8 window positions, where the backend keeps them
  bool argmax_kept_ = false;  // the last forward wrote argmax_
  Tensor x_;
};

class GlobalAvgPool : public Layer {
 public:
  GlobalAvgPool(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (in.rank != 3)
      throw ConfigError(fmt::format("{}: global_avg_pool needs a per-sample [H, W, C] input, got {}", where(cfg),
                                    in.str()));
    out_shape_ = Shape{in[2]};
    y_ = c.plan(t, out_shape_, name() + " output", true);
  }

  // The relu's backward is done with the broadcast (Backend::global_avg_pool_relu_backward).
  bool fuse_input_relu() override {
    relu_input_ = true;
    return true;
  }

  Tensor forward(Context& c, const Tensor& x) override {
    x_ = x;
    const Tensor y = y_.at(x.shape[0]);
    c.be->global_avg_pool_forward(x, y);
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    const Tensor dx = dx_.at(dy.shape[0]);
    if (relu_input_)
      c.be->global_avg_pool_relu_backward(x_, dy, dx);
    else
      c.be->global_avg_pool_backward(dy, dx);
    return dx;
  }

 private:
  Planned y_;
  bool relu_input_ = false;  // x is a relu's output whose gradient this layer computes too
  Tensor x_;
};

}  // namespace

std::unique_ptr<Layer> make_pool(const LayerArgs& a) {
  return std::make_unique<Pool>(a.c, a.cfg, a.in, a.t, a.depth);
}

std::unique_ptr<Layer> make_global_avg_pool(const LayerArgs& a) {
  return std::make_unique<GlobalAvgPool>(a.c, a.cfg, a.in, a.t, a.depth);
}

}  // namespace mpx::nn
