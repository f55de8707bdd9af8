// SPDX-License-Identifier: MIT
// The checkpoint file: everything a run needs to continue bit-exactly (float32
// master weights, batch-norm state, optimizer state, loss-scaler and schedule
// state, position in the data), in one self-checking binary file.
//
// Format (version 2, little-endian; docs/design.md "Checkpoints"):
//   offset 0      8 bytes  magic "MPXCKPT\0"
//   offset 8      u32      format version: 2 = the arenas hold each parameter at a multiple
//                          of the header's "param_align" elements (zeros between);
//                          1 = packed (no "param_align": 1), still read
//   offset 12     u32      H: length of the header
//   offset 16     H bytes  header, UTF-8 JSON (fields of CheckpointHeader, plus
//                          "sections": [{name, offset, count, crc32}])
//   offset 16+H   u32      CRC32 (zlib) of the header bytes
//   offset 20+H   sections, contiguous, in header order, each `count` float32:
//                 master, state, then opt1..optN: the optimizer's N state arenas
//                 (empty ones have count 0; as many as core/optimizer_kind.h lists:
//                 SGD writes 1, Adam 2, AMSGrad 3), then, with train.lookahead only,
//                 avg_master and avg_state
//   file size = 20 + H + 4 * sum(count); each section's CRC32 is in the header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint_state.h"

namespace mpx {

/// The version written for aligned arenas; packed ones (param_align 1) are written as version 1.
inline constexpr uint32_t kCheckpointVersion = 2;

struct CheckpointHeader {
  std::string config_name, policy, device, optimizer, dataset;
  uint64_t seed = 0;
  int64_t batch_size = 0;      // the global batch (all ranks)
  int64_t world_size = 1;      // data-parallel ranks that wrote it; --resume needs as many
  int64_t num_params = 0, num_state = 0;  // arena lengths, alignment gaps included
  int64_t param_align = 1;                 // elements; 1 = packed (every version 1 file)
  // Position: the next step to run is batch `step_in_epoch` of epoch `epoch` (0-based).
  int64_t epoch = 0, step_in_epoch = 0, global_step = 0;
  int64_t applied_updates = 0;  // Optimizer::iterations(): steps applied or skipped (Adam's t)
  LossScalerState scaler;
  ScheduleState schedule;
  double best_test_accuracy = 0;
  double last_test_accuracy = 0, last_test_loss = 0;
  // The running sums of the current (partial) epoch, so its train loss/accuracy continue exactly.
  double epoch_loss_sum = 0;
  int64_t epoch_correct = 0, epoch_count = 0, epoch_skipped = 0;
  double wall_seconds = 0;      // training time before this checkpoint
  double final_train_loss = 0, final_train_accuracy = 0;
  double start_loss = 0;  // TrainState::start_loss (absent in older files: 0, taken again)
  // TrainState's validation and early-stopping fields (absent in older files: 0 / false).
  double best_val_accuracy = 0, last_val_accuracy = 0, last_val_loss = 0, es_best = 0;
  int64_t es_wait = 0, stopped_early_epoch = 0;
  bool es_has_best = false, early_stopped = false;
  double best_epoch_train_loss = 0;  // train.divergence_patience (absent in older files: 0)
  int64_t epochs_without_improvement = 0;
  // TrainState's train.target_accuracy fields (absent in older files: not met, no first step).
  bool target_met = false;
  int64_t target_epoch = 0, target_step = 0;
  double target_seconds = 0, first_step_wall = -1;
  /// The model's parameters as "layer/name [shape]", in arena order (absent in older files:
  /// empty). --resume compares it with the model of the config (train_state.h).
  std::vector<std::string> params;
};

struct Checkpoint {
  CheckpointHeader header;
  std::vector<float> master;  // num_params
  std::vector<float> state;   // num_state (batch-norm moving statistics)
  /// The optimizer's state arenas in core/optimizer_kind.h's order (Adam: m, v; AMSGrad: m, v, v_hat;
  /// SGD: momentum, empty without).
  std::vector<std::vector<float>> opt;
  /// train.lookahead's averaged weights (master and state lengths), after the optimizer's
  /// sections as "avg_master" and "avg_state"; both empty without lookahead.
  std::vector<float> avg_master, avg_state;
};

/// Writes `c` to `path` atomically (temp file, fsync, rename, fsync folder). Throws Error.
void save_checkpoint(const std::string& path, const Checkpoint& c);

/**
 * @brief Reads and verifies a checkpoint: magic, version, header, sizes and
 * every CRC32. Throws DataError (exit 3) naming the file and the byte offset
 * for a missing, truncated or corrupt file.
 */
Checkpoint load_checkpoint(const std::string& path);

/// `--resume` argument -> checkpoint file: a file as is; a run directory ->
/// DIR/checkpoints/last.ckpt; a checkpoints folder -> DIR/last.ckpt.
/// Throws ConfigError when nothing is there.
std::string resolve_checkpoint_path(const std::string& dir_or_file);

}  // namespace mpx
