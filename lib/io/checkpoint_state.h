// SPDX-License-Identifier: MIT
// The plain training state a checkpoint stores beside its arenas: the loss scaler's
// (LossScalerState, SkipReason) and the schedule's (ScheduleState). The file format owns
// them so that lib/io needs nothing of lib/train; train/loss_scaler.h and train/schedule.h
// include this header.
#pragma once

#include <cstdint>
#include <string>

namespace mpx {

/// Why a step was skipped (the names appear in logs, metrics.jsonl, summary.json, checkpoints).
enum class SkipReason : uint8_t { None, NonfiniteForward, NonfiniteLoss, BackwardOverflow };
/// "", "nonfinite_forward", "nonfinite_loss", "backward_overflow".
const char* skip_reason_name(SkipReason r);
/// Inverse of skip_reason_name (unknown text -> None).
SkipReason parse_skip_reason(const std::string& s);

/// The part of the scaler that is training state (saved in checkpoints).
struct LossScalerState {
  double scale = 1.0;
  int64_t good_steps = 0;         // consecutive finite steps since the last growth or skip
  int64_t skipped_total = 0;
  int64_t consecutive_skips = 0;
  SkipReason last_skip_reason = SkipReason::None;
};

/// The mutable part of a schedule (reduce_on_plateau only), saved in checkpoints.
struct ScheduleState {
  double plateau_lr = 0;    // current base rate of reduce_on_plateau
  double best = 0;          // best monitored test loss (+inf before the first)
  int64_t wait = 0;         // epochs without improvement
  int64_t cooldown_counter = 0;
};

}  // namespace mpx
