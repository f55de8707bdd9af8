// SPDX-License-Identifier: MIT
// Layers without parameters that act element by element or only reshape:
// activation (any of core/activation.h; linear and softmax are identities here,
// softmax being fused into the loss), flatten (a view, no copy) and inverted dropout.
#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class ActivationLayer : public Layer {
 public:
  ActivationLayer(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth, bool is_last)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    act_ = parse_activation(cfg, is_last);
    out_shape_ = in;
    if (!act_.is_none()) y_ = c.plan(t, in, name() + " output", true);
  }

  void plan_dx(Context& c) override {
    if (!act_.is_none() && !backward_by_next_ && !by_previous_) Layer::plan_dx(c);
  }

  Activation standalone_activation() const override { return by_previous_ ? Activation() : act_; }
  void hand_activation_to_previous(Context& c) override {
    by_previous_ = true;  // forward returns x, backward dy: the layer before applies the activation
    c.activation_bytes -= y_.buf.bytes();
    y_ = Planned();
    c.workspace_bytes -= dx_.buf.bytes();
    dx_ = Planned();
  }

  bool ends_in_relu() const override { return act_ == Activation::Relu; }
  void skip_relu_backward(Context& c) override {
    backward_by_next_ = true;  // backward returns dy: its input-gradient buffer goes unused
    c.workspace_bytes -= dx_.buf.bytes();
    dx_ = Planned();
  }

  Tensor forward(Context& c, const Tensor& x) override {
    if (act_.is_none() || by_previous_) return x;
    x_ = x;  // the layer before keeps it (its output) for the backward pass
    const Tensor y = y_.at(x.shape[0]);
    c.be->activation_forward(act_, x, y);
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    if (act_.is_none() || backward_by_next_ || by_previous_) return dy;
    const int64_t n = dy.shape[0];
    const Tensor dx = dx_.at(n);
    c.be->activation_backward(act_, act_.backward_reads() == ActSaved::Input ? x_ : y_.at(n), dy, dx);
    return dx;
  }

 private:
  Activation act_;
  bool backward_by_next_ = false;  // the next layer computes this relu's gradient (Layer::fuse_input_relu)
  bool by_previous_ = false;       // the layer before applies the activation (Layer::absorb_next_activation)
  Planned y_;
  Tensor x_;
};

class Flatten : public Layer {
 public:
  Flatten(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    out_shape_ = Shape{in.numel()};
  }
  void plan_dx(Context&) override {}
  bool passes_relu_through() const override { return true; }
  Tensor forward(Context&, const Tensor& x) override { return x.reshaped(with_batch(x.shape[0], out_shape_)); }
  bool forwards_by_rows(const Context&) const override { return true; }
  Tensor forward_rows(Context& c, const Tensor& x, int64_t, int64_t) override { return forward(c, x); }
  Tensor forward_rows_done(const Tensor& x) override { return x.reshaped(with_batch(x.shape[0], out_shape_)); }
  Tensor backward(Context&, const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    return dy.reshaped(with_batch(dy.shape[0], in_shape_));
  }
};

class Dropout : public Layer {
 public:
  Dropout(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (!(cfg.rate >= 0.0 && cfg.rate < 1.0))
      throw ConfigError(fmt::format("{}: rate must be in [0, 1), got {}", where(cfg), cfg.rate));
    rate_ = static_cast<float>(cfg.rate);
    out_shape_ = in;
    y_ = c.plan(t, in, name() + " output", true);
    mask_ = c.plan(DType::U8, in, name() + " mask", true);
  }

  Tensor forward(Context& c, const Tensor& x) override {
    applied_ = c.training && rate_ > 0.0f;
    if (!applied_) return x;
    const int64_t n = x.shape[0];
    // One mask stream per (seed, step, layer): reproducible, independent of the other layers.
    const uint64_t seed = mix64(c.dropout_seed ^ mix64(c.step ^ mix64(static_cast<uint64_t>(index_) + 1)));
    const Tensor y = y_.at(n);
    c.be->dropout_forward(x, rate_, seed, 0, mask_.at(n), y);
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    if (!applied_) return dy;
    const int64_t n = dy.shape[0];
    const Tensor dx = dx_.at(n);
    c.be->dropout_backward(dy, mask_.at(n), rate_, dx);
    return dx;
  }

 private:
  float rate_ = 0.5f;
  bool applied_ = false;
  Planned y_, mask_;
};

}  // namespace

std::unique_ptr<Layer> make_activation(const LayerArgs& a) {
  return std::make_unique<ActivationLayer>(a.c, a.cfg, a.in, a.t, a.depth, a.is_last);
}

std::unique_ptr<Layer> make_flatten(const LayerArgs& a) {
  return std::make_unique<Flatten>(a.c, a.cfg, a.in, a.t, a.depth);
}

std::unique_ptr<Layer> make_dropout(const LayerArgs& a) {
  return std::make_unique<Dropout>(a.c, a.cfg, a.in, a.t, a.depth);
}

}  // namespace mpx::nn
