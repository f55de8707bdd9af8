// SPDX-License-Identifier: MIT
// The training step (docs/design.md "One training step, as data"): an Engine owns one
// model with its optimizer, loss scaler, batch buffers and gradient sync; a
// Stepper runs the step on them. Two steppers share one interface:
//  - the host step (host_step.cpp) reads the loss and the finiteness verdict back
//    every step (per-step skip diagnostics; data parallel; the CPU default);
//  - the device-state step (device_step.cpp, train.sync "log") keeps the loss
//    scale, verdicts and metrics on the device and reads them every log_every
//    steps, with double-buffered input upload and optional CUDA graph replay.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "dist/communicator.h"
#include "dist/grad_sync.h"
#include "nn/model.h"
#include "train/batch.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"

namespace mpx {

/// One step's outcome; with several ranks the sums and `n` are over all ranks (the global batch).
/// The device-state step returns `pending` (n only) and flush() returns the sums of every
/// step since the previous flush.
struct StepOutcome {
  bool applied = false;
  bool loss_finite = true;
  SkipReason reason = SkipReason::None;
  double loss_sum = 0, correct = 0;  // over the steps whose loss was finite
  int64_t n = 0;                     // records stepped over
  int64_t counted = 0;               // records of the steps whose loss was finite
  int64_t skipped = 0;               // steps skipped
  bool pending = false;              // the sums come with the next flush()
  bool stop = false;  // a rank was asked to stop (SIGINT/SIGTERM): every rank stops after this step
};

/// What a stepper works on (owned by the Engine).
struct StepParts {
  const Config& cfg;
  Policy policy;
  LossScaleMode mode;
  Backend& be;
  Model& model;
  Optimizer& opt;
  LossScaler& scaler;
  BatchBuffers& bb;
  GradSync& sync;
  Communicator* comm;     // host collectives (null: one process)
  uint64_t dropout_seed;  // rank 0 keeps the single-process masks
  int64_t inject_step;    // MPX_DEBUG_INJECT_INF on this rank (-1: none)
};

class Stepper {
 public:
  virtual ~Stepper() = default;
  /// One training step on a host batch. With several ranks `n` is this rank's shard of a
  /// global batch of `global_n` records (n may be 0). Throws DivergedError.
  virtual StepOutcome step(const uint8_t* images, const int32_t* labels, int64_t n, int64_t global_n, double lr,
                           int64_t global_step) = 0;
  /// Reads back the steps queued since the last flush (device-state step); empty otherwise.
  virtual StepOutcome flush() { return {}; }
  /// Steps queue work only; flush() reads the results.
  virtual bool deferred() const { return false; }
  /// Steps queued since the last flush().
  virtual bool pending() const { return false; }
  /// How the step synchronises, for the start-up log.
  const std::string& description() const { return what_; }

 protected:
  std::string what_;
};

/// The host-synchronised step.
std::unique_ptr<Stepper> make_host_stepper(const StepParts& p, std::string why);
/// The device-state step, or nullptr with `why` set where the config or the run rules it out.
std::unique_ptr<Stepper> make_device_stepper(const StepParts& p, std::string* why);

/// Set by the SIGINT/SIGTERM handler that app/ installs; the trainer finishes
/// the current step, saves `last`, writes summary.json and exits 130.
std::atomic<bool>& stop_requested();


/// @brief One model with its optimizer, loss scaler, batch buffers, gradient sync and stepper.
class Engine {
 public:
  /// `comm` (may be null: one process) carries the host collectives and, on the CPU, the
  /// gradient all-reduce; `device_comm` (NCCL, may be null) the gradient all-reduce on a GPU.
  /// `local_batch`: this rank's share of data.batch_size (0: all of it). The model's
  /// input normalization is set by the caller (Session).
  Engine(const Config& cfg, Policy policy, Backend& be, std::unique_ptr<Model> model, LossScaleMode mode,
         Communicator* comm = nullptr, int64_t local_batch = 0, Communicator* device_comm = nullptr);

  Model& model() { return *model_; }
  Optimizer& optimizer() { return opt_; }
  LossScaler& scaler() { return scaler_; }
  BatchBuffers& buffers() { return bb_; }
  Stepper& stepper() { return *stepper_; }
  const GradSync& sync() const { return sync_; }

  StepOutcome step(const uint8_t* images, const int32_t* labels, int64_t n, int64_t global_n, double lr,
                   int64_t global_step) {
    return stepper_->step(images, labels, n, global_n, lr, global_step);
  }
  StepOutcome flush() { return stepper_->flush(); }
  bool deferred() const { return stepper_->deferred(); }
  bool pending() const { return stepper_->pending(); }

 private:
  std::unique_ptr<Model> model_;
  Optimizer opt_;
  LossScaler scaler_;
  BatchBuffers bb_;
  GradSync sync_;
  std::unique_ptr<Stepper> stepper_;
};

}  // namespace mpx
