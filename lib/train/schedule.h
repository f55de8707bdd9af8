// SPDX-License-Identifier: MIT
// Learning-rate schedules: constant, step, cosine, reduce_on_plateau (Keras
// ReduceLROnPlateau on the test loss) and triangular, each with an optional linear warm-up.
// lr() is a pure function of the global step plus the plateau state, so a
// resumed run continues with exactly the same rates.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "io/checkpoint_state.h"

namespace mpx {

/**
 * @brief lr(step) for global step `step` (0-based, skipped steps included):
 *  - warm-up: for step < W = round(warmup_epochs * steps_per_epoch),
 *    lr = base(step) * (step + 1) / W;
 *  - constant: base; step: base * gamma^floor(epoch / step_epochs) with
 *    epoch = step / steps_per_epoch; cosine: min_lr + (base - min_lr) *
 *    (1 + cos(pi * p)) / 2 with p = (step - W) / (epochs * steps_per_epoch - W)
 *    clamped to [0, 1]; reduce_on_plateau: the current plateau rate; triangular:
 *    base * f(step), f linear through (0, start_factor), (K, 1) and (T, end_factor)
 *    with T = epochs * steps_per_epoch and K = round(peak_fraction * T).
 */
class LrSchedule {
 public:
  /// `base_lr` already includes scale_lr_by_batch. Throws ConfigError for an unknown name.
  LrSchedule(const ScheduleConfig& cfg, double base_lr, int64_t epochs, int64_t steps_per_epoch);

  double lr(int64_t step) const;
  /// reduce_on_plateau: feeds the test loss of an evaluated epoch (no-op for the others).
  /// Returns true when the rate was reduced.
  bool on_eval(double test_loss);

  const ScheduleState& state() const { return st_; }
  void set_state(const ScheduleState& s) { st_ = s; }
  int64_t warmup_steps() const { return warmup_steps_; }
  double base_lr() const { return base_lr_; }

 private:
  enum class Kind { Constant, Step, Cosine, Plateau, Triangular };
  ScheduleConfig cfg_;
  Kind kind_ = Kind::Constant;
  double base_lr_;
  int64_t epochs_, steps_per_epoch_, warmup_steps_ = 0;
  ScheduleState st_;
};

}  // namespace mpx
