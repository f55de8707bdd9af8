// SPDX-License-Identifier: MIT
// train.lookahead's two formulas (docs/fast-cifar.md, "Lookahead"): the decay of the update
// after global step `step` of `total`, and the update itself, in float32 on the host so that
// every backend computes the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "config/config.h"

namespace mpx {

/// decay * (step / total)^power (step / total capped at 1).
inline double lookahead_decay(const LookaheadConfig& c, int64_t step, int64_t total) {
  const double f = std::min(1.0, static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, total)));
  return c.decay * std::pow(f, c.power);
}

/// avg += (1 - decay) (w - avg), then w = avg, element by element (float32).
inline void lookahead_mix(std::vector<float>& avg, std::vector<float>& w, double decay) {
  const float t = static_cast<float>(1.0 - decay);
  for (size_t i = 0; i < w.size(); ++i) {
    avg[i] += t * (w[i] - avg[i]);
    w[i] = avg[i];
  }
}

}  // namespace mpx
