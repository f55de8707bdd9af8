// SPDX-License-Identifier: MIT
// LrSchedule: the four schedules with linear warm-up (formulas in schedule.h).
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace mpx {

LrSchedule::LrSchedule(const ScheduleConfig& cfg, double base_lr, int64_t epochs, int64_t steps_per_epoch)
    : cfg_(cfg), base_lr_(base_lr), epochs_(std::max<int64_t>(epochs, 1)),
      steps_per_epoch_(std::max<int64_t>(steps_per_epoch, 1)) {
  switch (cfg.name) {
    case ScheduleName::Constant: kind_ = Kind::Constant; break;
    case ScheduleName::Step: kind_ = Kind::Step; break;
    case ScheduleName::Cosine: kind_ = Kind::Cosine; break;
    case ScheduleName::ReduceOnPlateau: kind_ = Kind::Plateau; break;
    case ScheduleName::Triangular: kind_ = Kind::Triangular; break;
  }
  if (kind_ == Kind::Step && cfg.step_epochs <= 0)
    throw ConfigError("schedule.step_epochs must be > 0, got " + std::to_string(cfg.step_epochs));
  warmup_steps_ = static_cast<int64_t>(std::llround(std::max(0.0, cfg.warmup_epochs) *
                                                    static_cast<double>(steps_per_epoch_)));
  st_.plateau_lr = base_lr;
  st_.best = std::numeric_limits<double>::infinity();
}

double LrSchedule::lr(int64_t step) const {
  double lr = base_lr_;
  switch (kind_) {
    case Kind::Constant: break;
    case Kind::Step: {
      const int64_t epoch = step / steps_per_epoch_;
      lr = base_lr_ * std::pow(cfg_.gamma, static_cast<double>(epoch / cfg_.step_epochs));
      break;
    }
    case Kind::Cosine: {
      const int64_t total = epochs_ * steps_per_epoch_;
      const int64_t span = total - warmup_steps_;
      double p = span > 0 ? static_cast<double>(step - warmup_steps_) / static_cast<double>(span) : 1.0;
      p = std::clamp(p, 0.0, 1.0);
      lr = cfg_.min_lr + (base_lr_ - cfg_.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
      break;
    }
    case Kind::Plateau: lr = st_.plateau_lr; break;
    case Kind::Triangular: {
      // Linear from start_factor at step 0 to 1 at step K = round(peak_fraction * T), then to
      // end_factor at step T = epochs * steps_per_epoch (airbench's np.interp over 0, K, T).
      const int64_t total = epochs_ * steps_per_epoch_;
      const int64_t peak = std::llround(cfg_.peak_fraction * static_cast<double>(total));
      const double t = static_cast<double>(std::clamp<int64_t>(step, 0, total));
      double f;
      if (t <= static_cast<double>(peak))
        f = peak > 0 ? cfg_.start_factor + (1.0 - cfg_.start_factor) * t / static_cast<double>(peak) : 1.0;
      else
        f = 1.0 + (cfg_.end_factor - 1.0) * (t - static_cast<double>(peak)) / static_cast<double>(total - peak);
      lr = base_lr_ * f;
      break;
    }
  }
  if (step < warmup_steps_) lr *= static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  return lr;
}

bool LrSchedule::on_eval(double test_loss) {
  if (kind_ != Kind::Plateau) return false;
  // Keras ReduceLROnPlateau(monitor='val_loss', mode='min'), step for step: the cooldown
  // test is evaluated again after the decrement, and the counters reset only on a reduction.
  if (st_.cooldown_counter > 0) {
    --st_.cooldown_counter;
    st_.wait = 0;
  }
  if (test_loss < st_.best - cfg_.min_delta) {
    st_.best = test_loss;
    st_.wait = 0;
  } else if (st_.cooldown_counter <= 0) {
    if (++st_.wait >= cfg_.patience && st_.plateau_lr > cfg_.min_lr) {
      st_.plateau_lr = std::max(st_.plateau_lr * cfg_.factor, cfg_.min_lr);
      st_.cooldown_counter = cfg_.cooldown;
      st_.wait = 0;
      return true;
    }
  }
  return false;
}

}  // namespace mpx
