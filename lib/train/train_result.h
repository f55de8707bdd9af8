// SPDX-License-Identifier: MIT
// The record of one `mpx train` run, as summary.json holds it: returned by train()
// (trainer.h) and written by metrics.h, which therefore needs nothing else of the trainer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model.h"

namespace mpx {

/// @brief The record of a run (summary.json has exactly these fields).
struct TrainResult {
  std::string status = "failed";  // completed | diverged | interrupted | failed
  int exit_code = 1;
  std::string message;            // error message when not completed
  int64_t epochs = 0, steps = 0;
  double final_test_accuracy = 0, best_test_accuracy = 0, final_test_loss = 0;
  double final_train_loss = 0, final_train_accuracy = 0;
  double images_per_sec = 0, wall_seconds = 0;
  int64_t skipped_steps = 0;
  double final_loss_scale = 1;
  std::string last_skip_reason;   // "", "nonfinite_forward", "nonfinite_loss", "backward_overflow"
  size_t peak_memory_bytes = 0;
  std::string policy, device, eval_policy;
  MemoryReport memory;
  size_t optimizer_state_bytes = 0;
  std::string run_dir;
  /// The last test evaluation's confusion matrix (EvalResult); empty when none ran.
  int num_classes = 0;
  std::vector<int64_t> confusion;
  /// data.validation_split: the records held out (0 = none) and the validation figures;
  /// train.early_stopping: the epoch it stopped the run after (0 = it did not).
  int64_t validation_records = 0;
  double final_validation_loss = 0, final_validation_accuracy = 0, best_validation_accuracy = 0;
  int64_t stopped_early_epoch = 0;
  /// train.target_accuracy (0 = none) and, once an evaluation met it, when: its epoch, global
  /// step and the wall seconds from the run's first step (0 while not met).
  double target_accuracy = 0;
  bool target_met = false;
  int64_t target_epoch = 0, target_step = 0;
  double time_to_target_seconds = 0;
};

}  // namespace mpx
