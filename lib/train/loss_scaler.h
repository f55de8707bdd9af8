// SPDX-License-Identifier: MIT
// The loss scaler: the host-side state machine of Keras 2's LossScaleOptimizer
// (dynamic / fixed / none). It only decides; the trainer scales the loss,
// unscales the gradients and skips steps as it says.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "config/config.h"
#include "io/checkpoint_state.h"

namespace mpx {

/// What to try when training diverges under `policy` with loss scaling `mode`: only what
/// would change something ("loss_scale.mode: dynamic" only where it is not already dynamic).
/// Policy::Auto: the policy is not known to the caller.
std::string divergence_advice(Policy policy, LossScaleMode mode);

/**
 * @brief Keras 2 LossScaleOptimizer semantics.
 *
 *  - dynamic: S starts at `initial`; a skipped step multiplies S by backoff_factor
 *    (never below min_scale) and resets the good-step counter; after growth_interval
 *    consecutive finite steps S is multiplied by growth_factor (only while the result
 *    is finite in float32) and the counter resets.
 *  - fixed: S = initial forever; a non-finite step is still skipped and counted.
 *  - none: S = 1. The trainer still skips (and counts) a step whose gradients are
 *    non-finite rather than writing inf/NaN into the weights; under float32 a
 *    non-finite loss is a DivergedError before the scaler is asked.
 *
 * In every mode max_consecutive_skips skipped steps in a row raise DivergedError.
 */
class LossScaler {
 public:
  LossScaler(const LossScaleConfig& cfg, LossScaleMode mode);

  LossScaleMode mode() const { return mode_; }
  /// The factor the loss is multiplied by on the next step.
  double scale() const { return st_.scale; }
  const LossScalerState& state() const { return st_; }
  void set_state(const LossScalerState& s) { st_ = s; }

  /**
   * @brief Records the outcome of one step. `finite` = the step was applied.
   * When the step was skipped and it is the max_consecutive_skips-th in a row,
   * throws DivergedError; `diagnose` (optional) returns the text naming the
   * first non-finite layer, which the message includes.
   * @return true when the scale changed.
   */
  bool update(bool finite, SkipReason reason = SkipReason::BackwardOverflow,
              const std::function<std::string()>& diagnose = {});

 private:
  LossScaleConfig cfg_;
  LossScaleMode mode_;
  LossScalerState st_;
};

/// "2^15" for exact powers of two, else "%g" (logs).
std::string format_scale(double s);

}  // namespace mpx
