// SPDX-License-Identifier: MIT
// The optimizer of a run: its state arenas (Adam m/v or SGD momentum, same
// length as the master arena, allocated once) and the fused update of the
// whole arena through Backend::optimizer_step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"

namespace mpx {

class Optimizer {
 public:
  /// Allocates the state arenas on `backend` (zero-filled). Throws ConfigError for an unknown name.
  Optimizer(const OptimizerConfig& cfg, Backend& backend, int64_t num_params);

  /**
   * @brief One update of the whole arena with learning rate `lr`: master (f32),
   * grads (f32, already unscaled), and the 16-bit compute copy when not empty.
   * Adam's bias correction uses t = applied_updates() + 1; afterwards
   * applied_updates() grows by one.
   */
  void step(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, double lr);

  /// The same update queued with everything read on the device (train.sync "log"): lr from
  /// `lr` (float32 [1]), t from `step_state` (StepState), skipped when its verdict is
  /// non-finite. applied_updates() is brought up to date by the caller (set_applied_updates).
  void step_on_device(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, const Tensor& step_state,
                      const Tensor& lr);

  /// Updates applied so far (skipped steps excluded).
  int64_t applied_updates() const { return applied_; }
  void set_applied_updates(int64_t n) { applied_ = n; }

  OptimizerName name() const { return cfg_.name; }
  /// Momentum (SGD) or m (Adam); empty for SGD without momentum.
  Tensor state1() const { return state1_; }
  /// v (Adam); empty for SGD.
  Tensor state2() const { return state2_; }
  size_t state_bytes() const {
    return (state1_.empty() ? 0 : state1_.bytes()) + (state2_.empty() ? 0 : state2_.bytes());
  }

  /// Host copies for checkpoints, and the way back.
  std::vector<float> download_state1() const;
  std::vector<float> download_state2() const;
  void upload_state(const std::vector<float>& s1, const std::vector<float>& s2);

  /// The hyper-parameters of the fused pass for this lr and t (tests).
  OptimizerStep step_params(double lr, int64_t t) const;

 private:
  OptimizerConfig cfg_;
  Backend& backend_;
  OptimizerStep::Kind kind_ = OptimizerStep::Kind::Adam;
  int64_t n_;
  Buffer buf1_, buf2_;
  Tensor state1_, state2_;
  int64_t applied_ = 0;
};

}  // namespace mpx
