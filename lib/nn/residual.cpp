// SPDX-License-Identifier: MIT
// residual: a nested list of layers whose output is added to the block input,
// through a 1x1 convolution projection (<block>_projection, no bias) when the
// shapes differ. The add happens in the block's compute dtype; backward sums the
// branch's and the shortcut's input gradients.
#include <fmt/format.h>

#include "core/error.h"
#include "nn/sequence.h"

namespace mpx::nn {

namespace {

class Residual : public Layer {
 public:
  Residual(Context& c, const LayerConfig& cfg, Shape in, DType t, std::optional<LayerDType> inherited_dtype, int depth)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (cfg.layers.empty()) throw ConfigError(where(cfg) + ": a residual block needs a non-empty `layers` list");
    branch_.build(c, cfg.layers, in, t, inherited_dtype, depth + 1, false, false);
    out_shape_ = branch_.out_shape();
    if (out_shape_ != in) {
      if (in.rank != 3 || out_shape_.rank != 3)
        throw ConfigError(fmt::format(
            "{}: the branch output {} differs from the block input {} and a 1x1 projection needs [H, W, C] "
            "shapes on both sides",
            where(cfg), out_shape_.str(), in.str()));
      LayerConfig p;
      p.type = LayerType::Conv2d;
      p.name = cfg.name + "_projection";
      p.dtype = inherited_dtype;
      p.filters = out_shape_[2];
      p.kernel_h = p.kernel_w = 1;
      p.stride_h = static_cast<int>((in[0] + out_shape_[0] - 1) / out_shape_[0]);
      p.stride_w = static_cast<int>((in[1] + out_shape_[1] - 1) / out_shape_[1]);
      p.padding = Padding::Valid;
      p.use_bias = false;
      p.key_path = cfg.key_path;
      p.line = cfg.line;
      p.column = cfg.column;
      if ((in[0] - 1) / p.stride_h + 1 != out_shape_[0] || (in[1] - 1) / p.stride_w + 1 != out_shape_[1])
        throw ConfigError(fmt::format(
            "{}: no strided 1x1 projection maps the block input {} to the branch output {}; make the branch keep "
            "the spatial size or divide it by an integer stride",
            where(cfg), in.str(), out_shape_.str()));
      proj_ = make_conv2d({c, p, in, t, std::nullopt, depth + 1, false});
      proj_->plan_dx(c);
    }
    if (branch_.out_dtype() != t) {
      bcast_ = c.plan(t, out_shape_, name() + " branch output cast", false);
      dbcast_ = c.plan(branch_.out_dtype(), out_shape_, name() + " branch gradient cast", false);
    }
    y_ = c.plan(t, out_shape_, name() + " output", true);
  }

  Tensor forward(Context& c, const Tensor& x) override {
    const int64_t n = x.shape[0];
    Tensor b = branch_.forward(c, x);
    if (!bcast_.empty()) {
      c.be->cast(b, bcast_.at(n));
      b = bcast_.at(n);
    }
    Tensor s = x;
    if (proj_) {
      s = proj_->forward(c, x);
      proj_->last_out = s;
    }
    const Tensor y = y_.at(n);
    c.be->add(b, s, y);
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    const int64_t n = dy.shape[0];
    Tensor db = dy;
    if (!dbcast_.empty()) {
      c.be->cast(dy, dbcast_.at(n));
      db = dbcast_.at(n);
    }
    const Tensor gb = branch_.backward(c, db, need_dx);
    Tensor gs = dy;
    if (proj_) {
      gs = proj_->backward(c, dy, need_dx);
      grads_ready(c, *proj_);
      proj_->last_dx = gs;
    }
    if (!need_dx) return Tensor();
    const Tensor dx = dx_.at(n);
    c.be->add(gb, gs, dx);
    return dx;
  }

  int64_t param_count(const Context& c) const override {
    return branch_.param_count(c) + (proj_ ? proj_->param_count(c) : 0);
  }

  void append_infos(const Context& c, std::vector<LayerInfo>& out) const override {
    Layer::append_infos(c, out);
    branch_.append_infos(c, out);
    if (proj_) proj_->append_infos(c, out);
  }

  void collect(std::vector<Layer*>& out) override {
    branch_.collect(out);
    if (proj_) proj_->collect(out);
    out.push_back(this);
  }

  /// backward() runs the branch (last layer first), then the projection.
  void collect_backward(std::vector<const Layer*>& out) const override {
    branch_.collect_backward(out);
    if (proj_) proj_->collect_backward(out);
    out.push_back(this);
  }

 private:
  Sequence branch_;
  std::unique_ptr<Layer> proj_;
  Planned bcast_, dbcast_, y_;
};

}  // namespace

std::unique_ptr<Layer> make_residual(const LayerArgs& a) {
  return std::make_unique<Residual>(a.c, a.cfg, a.in, a.t, a.inherited_dtype, a.depth);
}

}  // namespace mpx::nn
