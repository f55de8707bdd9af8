// SPDX-License-Identifier: MIT
// The names of the skip reasons (checkpoint_state.h).
#include "io/checkpoint_state.h"

namespace mpx {

const char* skip_reason_name(SkipReason r) {
  switch (r) {
    case SkipReason::None: return "";
    case SkipReason::NonfiniteForward: return "nonfinite_forward";
    case SkipReason::NonfiniteLoss: return "nonfinite_loss";
    case SkipReason::BackwardOverflow: return "backward_overflow";
  }
  return "";
}

SkipReason parse_skip_reason(const std::string& s) {
  if (s == "nonfinite_forward") return SkipReason::NonfiniteForward;
  if (s == "nonfinite_loss") return SkipReason::NonfiniteLoss;
  if (s == "backward_overflow") return SkipReason::BackwardOverflow;
  return SkipReason::None;
}

}  // namespace mpx
