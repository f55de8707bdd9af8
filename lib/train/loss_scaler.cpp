// SPDX-License-Identifier: MIT
// LossScaler: Keras 2 dynamic / fixed / none loss scaling on the host.
#include "train/loss_scaler.h"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>

#include "core/error.h"

namespace mpx {

namespace {
const char* mode_name(LossScaleMode m) {
  switch (m) {
    case LossScaleMode::Dynamic: return "dynamic";
    case LossScaleMode::Fixed: return "fixed";
    case LossScaleMode::None: return "none";
  }
  return "none";
}
}  // namespace

std::string format_scale(double s) {
  if (s > 0) {
    int e = 0;
    const double m = std::frexp(s, &e);
    if (m == 0.5) return fmt::format("2^{}", e - 1);
  }
  return fmt::format("{:g}", s);
}

LossScaler::LossScaler(const LossScaleConfig& cfg, LossScaleMode mode) : cfg_(cfg), mode_(mode) {
  if (mode_ == LossScaleMode::None) {
    st_.scale = 1.0;
  } else {
    if (!(cfg.initial > 0) || !std::isfinite(cfg.initial) || cfg.initial > FLT_MAX)
      throw ConfigError(fmt::format("loss_scale.initial must be a positive finite float32, got {}", cfg.initial));
    st_.scale = cfg.initial;
    if (mode_ == LossScaleMode::Dynamic && st_.scale < cfg.min_scale) st_.scale = cfg.min_scale;
  }
}

bool LossScaler::update(bool finite, SkipReason reason, const std::function<std::string()>& diagnose) {
  const double before = st_.scale;
  if (finite) {
    st_.consecutive_skips = 0;
    if (mode_ == LossScaleMode::Dynamic) {
      if (++st_.good_steps >= cfg_.growth_interval) {
        const double grown = st_.scale * cfg_.growth_factor;
        // Keras grows only while the new scale is finite (here: in float32, the dtype it is used in).
        if (grown <= FLT_MAX) st_.scale = grown;
        st_.good_steps = 0;
      }
    }
    return st_.scale != before;
  }

  ++st_.skipped_total;
  ++st_.consecutive_skips;
  st_.last_skip_reason = reason == SkipReason::None ? SkipReason::BackwardOverflow : reason;
  st_.good_steps = 0;
  if (mode_ == LossScaleMode::Dynamic) {
    const double backed = st_.scale * cfg_.backoff_factor;
    st_.scale = backed < cfg_.min_scale ? cfg_.min_scale : backed;
  }
  if (cfg_.max_consecutive_skips > 0 && st_.consecutive_skips >= cfg_.max_consecutive_skips) {
    std::string where = diagnose ? diagnose() : std::string();
    throw DivergedError(fmt::format(
        "training diverged: {} consecutive steps were skipped (last reason: {}, loss scale {} mode {}){}. {}",
        st_.consecutive_skips, skip_reason_name(st_.last_skip_reason), format_scale(st_.scale),
        mode_name(mode_), where.empty() ? std::string() : "; " + where, divergence_advice(Policy::Auto, mode_)));
  }
  return st_.scale != before;
}

std::string divergence_advice(Policy policy, LossScaleMode mode) {
  std::string s = "Try a lower optimizer.learning_rate";
  const bool fp16 = policy == Policy::MixedFloat16 || policy == Policy::Auto;
  if (fp16 && mode != LossScaleMode::Dynamic) s += ", loss_scale.mode: dynamic";
  if (policy == Policy::MixedFloat16) s += ", policy: mixed_bfloat16 or float32";
  else if (policy == Policy::MixedBFloat16) s += ", policy: float32";
  else if (policy == Policy::Auto) s += ", another policy (mixed_bfloat16 or float32)";
  else s += ", a warm-up (schedule.warmup_epochs: 1)";
  return s + ", and debug.check_numerics: true to find the first non-finite layer on every step";
}

}  // namespace mpx
