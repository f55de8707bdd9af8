// SPDX-License-Identifier: MIT
// `mpx train`: the epoch loop and its failure handling, over the parts of the
// train module (docs/design.md "Train module layout"): Session (set-up),
// Engine and its Stepper (the step), TrainState (checkpoints), RunLog (logs and
// metrics) and evaluation. This header is the module's front door for app/ and
// the tests; the commands built on it (bench, inspect, eval of a file) are in lib/commands.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "nn/model.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/stepper.h"
#include "train/train_result.h"

namespace mpx {

/// @brief Options from the command line that are not part of the config.
struct TrainOptions {
  std::string run_dir;  // "" = runs/<name>-<timestamp>
  std::string resume;   // "" or a run directory or checkpoint file
  bool progress = true; // live progress line when stderr is a terminal
  bool overwrite = false; // --overwrite: a run directory holding a previous run is cleared first
  /// --resume: the run's own config.yaml, which the config must match but for the keys that
  /// cannot change the result (resume_neutral_key) and those in allow_changes ("" = no check).
  std::string resume_config;
  std::vector<std::string> allow_changes;  // --allow-changes: keys (or sections) that may differ
};

/**
 * @brief Runs `mpx train`.
 *
 * Run directory: opts.run_dir, else (when resuming from a file in <run>/checkpoints)
 * that run's directory, whose train.log and metrics.jsonl are appended to and
 * whose config.yaml and summary.json are replaced; else runs/<name>-<timestamp>.
 * config.yaml holds the resolved policy and loss-scale mode (device as given).
 * Loss scaling `none`: S = 1; a step with non-finite gradients is still skipped
 * and counted (never applied) under every policy; a non-finite loss is a
 * DivergedError under float32 and a skipped step under the mixed policies.
 *
 * Never throws for training failures: they are
 * recorded in the result (and summary.json) with their exit code. Errors found
 * before the run directory exists are thrown: ConfigError (bad device, --resume
 * path), DataError (exit 3: the checkpoint to resume is corrupt or truncated).
 * A checkpoint that does not fit the model (exit 2) is recorded in the result.
 */
TrainResult train(const Config& cfg, const TrainOptions& opts);

/// Keys a resumed run may change without changing its result: log cadence, checkpoint
/// cadence, TensorBoard output, the numerics check, the run name, where it stops (train.max_steps).
bool resume_neutral_key(const std::string& key);

/// The run directory a --resume argument belongs to: the folder itself, or the run above a
/// checkpoints/ folder or a checkpoint file in one ("" for a file elsewhere).
std::string resume_run_dir(const std::string& resume);

}  // namespace mpx
