// SPDX-License-Identifier: MIT
// batch_norm: statistics, gamma/beta and the moving statistics in float32
// whatever the policy (gamma/beta in the master arena, moving mean/variance in
// the state arena); input and output in the layer's compute dtype.
#include <fmt/format.h>

#include "core/error.h"
#include "nn/layer.h"

namespace mpx::nn {

namespace {

class BatchNorm : public Layer {
 public:
  BatchNorm(Context& c, const LayerConfig& cfg, Shape in, DType t, int depth)
      : Layer(cfg, t, in, depth, c.next_layer_index++) {
    if (in.rank != 3 && in.rank != 1)
      throw ConfigError(fmt::format("{}: batch_norm needs a per-sample [H, W, C] or [C] input, got {}", where(cfg),
                                    in.str()));
    if (!(cfg.epsilon > 0) || !(cfg.momentum >= 0 && cfg.momentum <= 1))
      throw ConfigError(fmt::format("{}: epsilon ({}) must be > 0 and momentum ({}) in [0, 1]", where(cfg),
                                    cfg.epsilon, cfg.momentum));
    momentum_ = static_cast<float>(cfg.momentum);
    epsilon_ = static_cast<float>(cfg.epsilon);
    const int64_t C = in[in.rank - 1];
    out_shape_ = in;
    // PyTorch's BatchNorm names: weight, bias, running_mean, running_var.
    using L = ExportLayout;
    // scale: false (Keras scale=False): gamma stays 1, kept with the moving statistics (the
    // pytorch layout's weight with requires_grad off); its gradient goes to a scratch buffer.
    scale_ = cfg.scale;
    gamma_ = c.add_param(name(), "gamma", Shape{C}, scale_, Init::Ones, {L::InputFeatures, "weight"});
    beta_ = c.add_param(name(), "beta", Shape{C}, true, Init::Zeros, {L::InputFeatures, "bias"});
    mean_ = c.add_param(name(), "moving_mean", Shape{C}, false, Init::Zeros, {L::InputFeatures, "running_mean"});
    var_ = c.add_param(name(), "moving_variance", Shape{C}, false, Init::Ones, {L::InputFeatures, "running_var"});
    param_ids_ = {gamma_, beta_, mean_, var_};
    y_ = c.plan(t, in, name() + " output", true);
    saved_mean_ = c.plan_flat(DType::F32, C, name() + " saved mean", true);
    saved_invstd_ = c.plan_flat(DType::F32, C, name() + " saved inverse std", true);
    if (!scale_) dgamma_ = c.plan_flat(DType::F32, C, name() + " gamma gradient (unused: scale false)", false);
    // The backend always writes dx, also for a first layer that needs none.
    Layer::plan_dx(c);
  }

  // A GELU, silu or other activation whose backward reads its input, right after a 16-bit
  // batch norm: applied in the batch norm's ops, so that its input is never stored. Not in
  // float32, where oneDNN's batch norm and the activation loops measured faster than the
  // fused loops (docs/cpu-performance.md, "Batch norm and the activation after it").
  bool absorb_next_activation(Context&, Activation a) override {
    if (!is_16bit(dtype_) || !act_.is_none() || a.backward_reads() != ActSaved::Input) return false;
    act_ = a;
    return true;
  }

  Tensor forward(Context& c, const Tensor& x) override {
    x_ = x;
    trained_ = c.training;
    const Tensor y = y_.at(x.shape[0]);
    if (c.training) {
      c.be->batch_norm_forward_training(x, gamma(c), c.master_of(beta_), momentum_, epsilon_,
                                        c.state_of(mean_), c.state_of(var_), saved_mean_.buf.view(DType::F32, saved_mean_.per_sample),
                                        saved_invstd_.buf.view(DType::F32, saved_invstd_.per_sample), y, act_);
    } else {
      c.be->batch_norm_forward_inference(x, gamma(c), c.master_of(beta_), c.state_of(mean_),
                                         c.state_of(var_), epsilon_, y, act_);
    }
    return y;
  }

  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override {
    MPX_CHECK_MSG(trained_, name() + ": backward needs a training-mode forward (batch statistics)");
    const Tensor dx = dx_.at(dy.shape[0]);
    c.be->batch_norm_backward(x_, dy, gamma(c), saved_mean_.buf.view(DType::F32, saved_mean_.per_sample),
                              saved_invstd_.buf.view(DType::F32, saved_invstd_.per_sample), dx,
                              scale_ ? c.grad_of(gamma_) : dgamma_.buf.view(DType::F32, dgamma_.per_sample),
                              c.grad_of(beta_), c.master_of(beta_), act_);
    return need_dx ? dx : Tensor();
  }

 private:
  Tensor gamma(const Context& c) const { return scale_ ? c.master_of(gamma_) : c.state_of(gamma_); }
  bool scale_ = true;
  Planned dgamma_;
  float momentum_ = 0.99f, epsilon_ = 1e-3f;
  int gamma_ = -1, beta_ = -1, mean_ = -1, var_ = -1;
  bool trained_ = false;
  Activation act_;  // the next layer's activation, applied here (absorb_next_activation)
  Planned y_, saved_mean_, saved_invstd_;
  Tensor x_;
};

}  // namespace

std::unique_ptr<Layer> make_batch_norm(const LayerArgs& a) {
  return std::make_unique<BatchNorm>(a.c, a.cfg, a.in, a.t, a.depth);
}

}  // namespace mpx::nn
