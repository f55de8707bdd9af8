// SPDX-License-Identifier: MIT
// The state of a training run beyond the weights, and the one mapping between
// a run and its checkpoint file (checkpoint.h): position, best and last test
// results, the running sums of a partial epoch, the optimizer's state arenas,
// the loss scaler and the schedule. --resume restores exactly what save wrote.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "io/checkpoint.h"
#include "nn/model.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace mpx {

/// The running sums of the current epoch's training steps.
struct EpochSums {
  double loss_sum = 0;
  int64_t correct = 0, count = 0, skipped = 0;
  double loss() const;      // mean, NaN before any counted step
  double accuracy() const;  // 0 before any counted step
};

struct TrainState {
  // Position: the next step to run is batch `step_in_epoch` of epoch `epoch` (0-based).
  int64_t epoch = 0, step_in_epoch = 0, global_step = 0;
  double best_test_accuracy = 0, last_test_accuracy = 0, last_test_loss = 0;
  EpochSums sums;
  double prior_wall_seconds = 0;  // training time of the runs before this one
  double final_train_loss = 0, final_train_accuracy = 0;
  /// The mean loss of the first steps read back (the first step where the host reads every
  /// step), the reference of train.divergence_factor; 0 = not taken yet.
  double start_loss = 0;
  /// With data.validation_split: the validation figures, and train.early_stopping's best
  /// monitored value, evaluations without improvement and whether it stopped the run.
  double best_val_accuracy = 0, last_val_accuracy = 0, last_val_loss = 0;
  double es_best = 0;
  int64_t es_wait = 0;
  bool es_has_best = false, early_stopped = false;
  int64_t stopped_early_epoch = 0;
  /// train.divergence_patience: the best epoch train loss so far and the epochs since.
  double best_epoch_train_loss = 0;
  int64_t epochs_without_improvement = 0;
  /// train.target_accuracy: whether an evaluation has reached it, when (epoch, global step,
  /// wall seconds from the first step), and the run's wall clock when its first step began.
  bool target_met = false;
  int64_t target_epoch = 0, target_step = 0;
  double target_seconds = 0, first_step_wall = -1;
  /// train.lookahead: the averaged weights (master and state arenas), on the host; empty
  /// when lookahead is off.
  std::vector<float> avg_master, avg_state;
};

/// What is trained: the parts a checkpoint holds beyond TrainState.
struct TrainedParts {
  Backend& be;
  Model& model;
  Optimizer& opt;
  LossScaler& scaler;
  LrSchedule& sched;
};

/// Who wrote it (the header's identity fields).
struct RunIdentity {
  std::string device;
  int64_t world_size = 1;
};

/// @brief Loads the master weights and batch-norm state of `ck` into `m` after checking
/// that they fit (ConfigError naming the file and both models otherwise), then refreshes
/// the 16-bit compute copy.
void restore_model(Backend& be, Model& m, const Checkpoint& ck, const std::string& path, const Config& cfg);

/// "layer/name [shape]" of every parameter of `m`, in arena order (the checkpoint's `params`).
std::vector<std::string> model_signature(const Model& m);

/// @brief The checkpoint of position (`epoch`, `step_in_epoch`): at an epoch boundary
/// (step 0) the epoch's sums are not carried. `wall_seconds`: training time so far.
Checkpoint make_checkpoint(const Config& cfg, const RunIdentity& who, const TrainState& st, int64_t epoch,
                           int64_t step_in_epoch, double wall_seconds, const TrainedParts& parts);

/// @brief Restores weights, optimizer, scaler and schedule from `ck` and returns the
/// state to continue from (an epoch finished at its last step continues with the next).
/// The rule (docs/design.md "Resuming"): a different architecture (the parameters' names
/// and shapes), data set or optimizer is a ConfigError naming what differs; a different
/// seed or batch size only warns (the run continues, no longer bit-exact).
TrainState restore_checkpoint(const Checkpoint& ck, const std::string& path, const Config& cfg,
                              int64_t steps_per_epoch, const TrainedParts& parts);

}  // namespace mpx
