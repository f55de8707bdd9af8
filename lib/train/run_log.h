// SPDX-License-Identifier: MIT
// What a training run tells people and scripts while it runs: the live
// progress line on a terminal, the log lines (console and train.log) and the
// metrics.jsonl records (docs/design.md "The run directory").
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "io/run_dir.h"
#include "io/tensorboard.h"
#include "train/metrics.h"

namespace mpx {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t);
/// "42s", "3m07s", "2h05m09s"; "?" when unknown.
std::string format_duration(double s);

/// The live progress line on a terminal (core/live_line.h), at most five updates a second.
class Progress {
 public:
  explicit Progress(bool on) : on_(on) {}
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  bool on() const { return on_; }
  void show(const std::string& s);
  void clear();

 private:
  bool on_;
  Clock::time_point last_{};
};

/// One log window's figures (every log_every steps).
struct StepRecord {
  int64_t epoch = 0, epochs = 0, pos = 0, steps_per_epoch = 0, global_step = 0;
  double loss = 0, accuracy = 0, lr = 0, loss_scale = 1, images_per_sec = 0, eta_seconds = 0;
  int64_t skipped_total = 0;
  size_t memory_bytes = 0;
};

/// @brief The run's log outputs; rank 0 writes the files, other ranks only log.
class RunLog {
 public:
  /// Opens train.log under `dir` (rank 0); `progress`: show the live line.
  RunLog(const std::string& dir, bool rank0, bool progress);
  /// Opens metrics.jsonl (appending when resuming into the same run).
  void open_metrics(bool append);
  /// Also writes every metrics record as TensorBoard scalars under <dir>/tensorboard (rank 0;
  /// a resumed run adds new event files beside the old ones).
  void open_tensorboard();

  /// The step log line (train.log; the console too unless the progress line shows it)
  /// and its metrics.jsonl record.
  void step(const StepRecord& r);
  /// Whether the live line shows (a terminal, rank 0, not --no-progress).
  bool progress_on() const { return progress_.on(); }
  /// The live line.
  void progress(const std::string& line) { progress_.show(line); }
  void clear_progress() { progress_.clear(); }
  /// One metrics.jsonl record as is (and its TensorBoard scalars).
  void record(const nlohmann::json& rec);
  /// One info line for train.log only (the command prints its own result line on stdout).
  void file_only(const std::string& line);
  void flush();

 private:
  std::string dir_;
  bool rank0_;
  std::optional<LogFileSink> file_;
  std::optional<MetricsWriter> metrics_;
  std::optional<TensorBoardLog> tensorboard_;
  Progress progress_;
};

}  // namespace mpx
