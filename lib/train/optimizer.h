// SPDX-License-Identifier: MIT
// The optimizer of a run: its state arenas (as many as core/optimizer_kind.h lists for
// it, each as long as the master arena, allocated once) and the fused update of the
// whole arena through Backend::optimizer_step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "nn/model.h"

namespace mpx {

class Optimizer {
 public:
  /// Allocates the state arenas on `backend` (zero-filled). Throws ConfigError for an unknown name.
  Optimizer(const OptimizerConfig& cfg, Backend& backend, int64_t num_params);

  /**
   * @brief One update of the whole arena with learning rate `lr`: master (f32),
   * grads (f32, already unscaled), and the 16-bit compute copy when not empty.
   * Adam's bias correction uses t = iterations() + 1; afterwards
   * iterations() grows by one.
   */
  void step(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, double lr);

  /// The same update queued with everything read on the device (train.sync "log"): lr from
  /// `lr` (float32 [1]), t from `step_state` (StepState), skipped when its verdict is
  /// non-finite. iterations() is brought up to date by the caller (set_iterations).
  void step_on_device(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, const Tensor& step_state,
                      const Tensor& lr);

  /// Steps so far, applied or skipped: Keras 2's optimizer.iterations, which its
  /// LossScaleOptimizer advances on a skipped step too (docs/precision.md).
  int64_t iterations() const { return applied_; }
  void set_iterations(int64_t n) { applied_ = n; }
  /// A skipped step: the state arenas are untouched, the iteration count advances.
  void skip() { ++applied_; }

  OptimizerName name() const { return cfg_.name; }
  /// The number of state arenas of an optimizer, each as long as the master arena, in
  /// checkpoint order (core/optimizer_kind.h: SGD momentum, empty without momentum;
  /// Adam/AdamW m, v; AMSGrad m, v, v_hat).
  static int num_arenas(const OptimizerConfig& cfg);
  /// Bytes of state it keeps for `num_params` parameters (plain SGD keeps none).
  static size_t state_bytes_for(const OptimizerConfig& cfg, int64_t num_params);
  /// Every state arena, in that order.
  const std::vector<Tensor>& states() const { return states_; }
  /// Momentum (SGD) or m (Adam); empty for SGD without momentum.
  Tensor state1() const { return arena(0); }
  /// v (Adam); empty for SGD.
  Tensor state2() const { return arena(1); }
  size_t state_bytes() const;

  /// Host copies of every arena for checkpoints (an empty arena gives an empty vector), and
  /// the way back; upload throws ConfigError naming the sizes when they do not fit.
  std::vector<std::vector<float>> download_states() const;
  void upload_states(const std::vector<std::vector<float>>& s);

  /// The hyper-parameters of the fused pass for this lr and t (tests).
  OptimizerStep step_params(double lr, int64_t t) const;

  /// Parameter groups (docs/fast-cifar.md, "Parameter groups"): from the config's
  /// lr_multipliers, weight_decay_multipliers and freeze_after_epochs over the model's
  /// parameters, the arena is updated in ranges of equal settings. Without rules the whole
  /// arena is one pass, as before. Throws ConfigError for a rule that matches no trainable
  /// parameter.
  void set_groups(const std::vector<ParamInfo>& params);
  /// The epoch of the next steps (freeze_after_epochs).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  /// Whether the next steps update the gradient-arena element at `offset`: false inside a
  /// range with a learning-rate multiplier of 0 or past its freeze_after_epochs epoch.
  bool updates(int64_t offset) const;
  /// One range of the arena with its settings.
  struct Segment {
    int64_t offset = 0, count = 0;
    float lr_mult = 1.0f, wd_mult = 1.0f;
    int64_t until_epoch = -1;  // updated in epochs < until_epoch only; -1 = always
  };
  const std::vector<Segment>& segments() const { return segments_; }

 private:
  /// A multiplier of 0, or past its freeze_after_epochs epoch: the step leaves it alone.
  bool frozen(const Segment& s) const;
  OptimizerConfig cfg_;
  Backend& backend_;
  OptimizerStep::Kind kind_ = OptimizerStep::Kind::Adam;
  int64_t n_;
  std::vector<Buffer> bufs_;
  std::vector<Tensor> states_;
  Tensor arena(size_t i) const { return i < states_.size() ? states_[i] : Tensor(); }
  int64_t applied_ = 0;
  std::vector<Segment> segments_;
  int64_t epoch_ = 0;
  /// Calls f(segment, its views of master, grads, states, compute copy) for each range updated
  /// in this epoch (the whole arena when there are no groups).
  template <typename F>
  void for_segments(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, F&& f) const;
};

}  // namespace mpx
