// SPDX-License-Identifier: MIT
// The per-step update of a StepState (the loss scaler of train/loss_scaler.cpp and the
// log-window sums), written once for the host and the device: the CPU backend calls it
// directly, the CUDA backend from a one-thread kernel, so both follow the same rule as
// LossScaler::update line by line.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/backend.h"

#if defined(__CUDACC__)
#define MPX_HOST_DEVICE __host__ __device__
#else
#define MPX_HOST_DEVICE
#endif

namespace mpx {

/// SkipReason values as stored in StepState::last_skip_reason (io/checkpoint_state.h).
constexpr int32_t kStepSkipNonfiniteLoss = 2;
constexpr int32_t kStepSkipBackwardOverflow = 3;

MPX_HOST_DEVICE inline bool step_isfinite(float v) {
#if defined(__CUDA_ARCH__)
  return isfinite(v);
#else
  return std::isfinite(v);
#endif
}

/// Loss scale of the loss gradient: float(S * weight), as the host path computes it.
MPX_HOST_DEVICE inline float step_grad_scale(const StepState& st, double weight) {
  return static_cast<float>(st.scale * weight);
}

/// Inverse scale of unscale_and_check: float(1 / (S * world)), as the host path computes it.
MPX_HOST_DEVICE inline float step_inv_scale(const StepState& st, int world) {
  return static_cast<float>(1.0 / (st.scale * static_cast<double>(world)));
}

/// One step's update from st.finite (set by unscale_and_check_state), the step's loss sum,
/// correct count and records `n`.
MPX_HOST_DEVICE inline void step_state_update(StepState& st, const LossScaleRule& rule, float loss, float correct,
                                              int64_t n) {
  const bool loss_finite = step_isfinite(loss);
  ++st.steps;
  if (loss_finite) {
    st.loss_sum += static_cast<double>(loss);
    st.correct += static_cast<double>(correct);
    st.counted += n;
  } else {
    ++st.nonfinite_loss_steps;
  }
  ++st.applied_total;  // Keras 2: a skipped step advances optimizer.iterations too (docs/precision.md)
  if (st.finite) {
    st.consecutive_skips = 0;
    if (rule.mode == LossScaleRule::Mode::Dynamic) {
      if (++st.good_steps >= rule.growth_interval) {
        const double grown = st.scale * rule.growth_factor;
        if (grown <= 3.40282346638528859811704183484516925e+38) st.scale = grown;  // FLT_MAX: finite in float32
        st.good_steps = 0;
      }
    }
    return;
  }
  ++st.skipped_total;
  ++st.skipped;
  ++st.consecutive_skips;
  if (st.consecutive_skips > st.max_consecutive_skips) st.max_consecutive_skips = st.consecutive_skips;
  st.last_skip_reason = loss_finite ? kStepSkipBackwardOverflow : kStepSkipNonfiniteLoss;
  st.good_steps = 0;
  if (rule.mode == LossScaleRule::Mode::Dynamic) {
    const double backed = st.scale * rule.backoff_factor;
    st.scale = backed < rule.min_scale ? rule.min_scale : backed;
  }
}

}  // namespace mpx
