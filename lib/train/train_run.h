// SPDX-License-Identifier: MIT
// Internal to lib/train: one `mpx train` run as an object (trainer.h has the
// contract). trainer.cpp holds its set-up, train_epochs.cpp its epoch loop.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "data/dataset.h"
#include "dist/communicator.h"
#include "io/checkpoint.h"
#include "io/run_dir.h"
#include "train/run_log.h"
#include "train/schedule.h"
#include "train/session.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace mpx::train_detail {

/// One `mpx train` run (see train() in trainer.h for the contract).
class TrainRun {
 public:
  TrainRun(const Config& cfg, const TrainOptions& opts)
      : opts_(opts), comm_(world()), rank_(comm_.rank()), world_(comm_.world_size()), rank0_(rank_ == 0) {
    if (cfg.data.batch_size <= 0) throw ConfigError("data.batch_size must be > 0");
    if (cfg.data.batch_size % world_ != 0)
      throw ConfigError(fmt::format("data.batch_size {} (the global batch) does not divide evenly over the {} "
                                    "ranks; use a multiple of {}",
                                    cfg.data.batch_size, world_, world_));
    local_batch_ = cfg.data.batch_size / world_;
    if (cfg.train.early_stopping.monitor != EarlyStopMonitor::None && cfg.data.validation_split <= 0)
      throw ConfigError("train.early_stopping watches the validation split, never the test set: set "
                        "data.validation_split (e.g. 0.1), or train.early_stopping.monitor: none");
    session_ = std::make_unique<Session>(cfg);
  }

  TrainResult run();

 private:
  // Phase 1 (errors are thrown): device, backend, policy, the checkpoint to resume, the run directory.
  void start();
  // Phase 2 (errors are recorded in summary.json): logs, data, model, resume, then the epochs.
  void prepare();
  void build_engine();
  void restore_or_broadcast();
  void log_plan();
  void run_epochs();
  /// One epoch's steps from the loader's position; false when the run stops inside it.
  bool run_steps(int64_t& epoch_images, double& epoch_seconds);
  /// Evaluation, metrics record and checkpoints of a complete epoch; true when last.ckpt was saved.
  bool end_epoch(Clock::time_point t_epoch, int64_t epoch_images, double epoch_seconds);
  void finish();
  void record_failure(const std::string& status, int code, const std::string& message);
  void finalize();

  void all_ranks(const std::string& what, const std::function<void()>& fn) {
    try {
      run_on_all_ranks(comm_, what, fn);
    } catch (...) {
      if (world_ > 1) collective_failure_ = true;
      throw;
    }
  }
  const Config& cfg() const { return session_->config(); }
  Backend& be() const { return session_->backend(); }
  TrainedParts parts() { return {be(), engine_->model(), engine_->optimizer(), engine_->scaler(), *sched_}; }
  void save(const std::string& name, int64_t epoch, int64_t step);
  /// The test split, or with `validation` the held-out validation split.
  EvalResult evaluate(bool validation = false);
  /// train.early_stopping after a validation evaluation: true when it ends the run.
  /// `improved`: the monitored figure improved (best.ckpt follows it).
  bool early_stop_after(const EvalResult& val, int64_t epoch, bool& improved);
  void absorb(const StepOutcome& o);
  /// Throws DivergedError when `loss` (a mean train loss just read back) is past
  /// train.divergence_factor times the run's starting loss.
  void check_loss_growth(double loss);
  /// Throws DivergedError when the epoch train loss has not improved for train.divergence_patience epochs.
  void check_train_loss_plateau(double train_loss, int64_t epoch);
  /// train.target_accuracy: records (state, the epoch's metrics record `rec`, the log) the
  /// first evaluation whose accuracy reaches it; true for that one.
  bool reach_target(double accuracy, int64_t epoch, nlohmann::json& rec);
  /// train.lookahead: takes the averaged weights from the checkpoint, else from the model.
  void start_lookahead();
  /// One lookahead update with this decay (docs/fast-cifar.md, "Lookahead").
  void lookahead(double decay);
  void log_step(double lr, int64_t epoch_images, double epoch_seconds);

  TrainOptions opts_;
  Communicator& comm_;
  int rank_, world_;
  bool rank0_;
  int64_t local_batch_ = 0;
  Clock::time_point t_start_ = Clock::now();
  std::unique_ptr<Session> session_;
  bool collective_failure_ = false;  // every rank knows of the failure (no MPI_Abort needed)
  std::optional<Checkpoint> resume_;
  std::string resume_path_, run_dir_, ckpt_dir_;
  bool append_ = false;
  TrainResult result_;
  std::unique_ptr<RunDirLock> lock_;  // rank 0: the run directory is this run's alone
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<Communicator> nccl_;  // the GPU gradient all-reduce
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Model> eval_model_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<LrSchedule> sched_;
  int64_t steps_per_epoch_ = 0;
  TrainState st_;
  // The log window (since the last log line).
  double win_loss_ = 0, win_correct_ = 0;
  int64_t win_count_ = 0, win_images_ = 0;
  Clock::time_point t_win_{};
  double run_train_seconds_ = 0;
  int64_t run_images_ = 0;
  std::string stop_kind_;  // "" | "interrupted" | "max_steps"
  bool evaluated_at_end_ = false;
  // Whether the test figures and the train loss of result_ were measured (else summary.json
  // has null for them, never a 0 that looks like a result).
  bool test_measured_ = false, train_measured_ = false;
};

}  // namespace mpx::train_detail
