// SPDX-License-Identifier: MIT
// The training driver: resolves device and policy, builds Model and loaders,
// runs the train/evaluate loop with loss scaling, logging, metrics.jsonl,
// checkpoints and summary.json. app/ only wires these calls to the CLI.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "nn/model.h"

namespace mpx {

/// @brief What `device: auto|cpu|cuda|cuda:N` resolves to here, and why.
struct ResolvedDevice {
  std::string device;  // "cpu" or "cuda:N"
  std::string reason;
};
ResolvedDevice resolve_device(const std::string& device);

/// @brief Resolves Policy::Auto from the device (DESIGN.md table); other
/// policies are returned unchanged. `reason` says what was chosen and why.
Policy resolve_policy(Policy p, const DeviceInfo& dev, std::string* reason);

/// @brief Start-up warnings of the Keras guides for this config (mixed_float16
/// without loss scaling, 16-bit softmax output, loss scale under bf16/float32,
/// auto -> float32). Each is one line; the caller logs them at warn level.
std::vector<std::string> precision_warnings(const Config& cfg, Policy resolved, bool auto_fell_back);

/// @brief Options from the command line that are not part of the config.
struct TrainOptions {
  std::string run_dir;  // "" = runs/<name>-<timestamp>
  std::string resume;   // "" or a run directory or checkpoint file
  bool progress = true; // live progress line when stderr is a terminal
};

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
};

/// Set by the SIGINT/SIGTERM handler that app/ installs; the trainer finishes
/// the current step, saves `last`, writes summary.json and exits 130.
std::atomic<bool>& stop_requested();

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

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
  std::string policy;
};
/// @brief `mpx eval`: test loss/accuracy of a checkpoint (file or run directory).
EvalResult evaluate_checkpoint(const Config& cfg, const std::string& checkpoint);

struct BenchResult {
  double images_per_sec = 0, step_ms_median = 0, step_ms_min = 0, step_ms_max = 0;
  /// train.sync log only (else 0): images/s of `steps` more steps timed as one block, the
  /// device synchronised at the end only (what a training run sees).
  double images_per_sec_pipelined = 0;
  size_t peak_memory_bytes = 0;
  std::string policy, device;
  int64_t batch_size = 0, steps = 0;
  MemoryReport memory;
};
/// @brief `mpx bench`: times `steps` training steps after `warmup` (real data when present, else random).
BenchResult bench(const Config& cfg, int64_t steps, int64_t warmup);

}  // namespace mpx
