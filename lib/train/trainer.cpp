// SPDX-License-Identifier: MIT
// `mpx train` (trainer.h): the run's set-up: device, backend, policy, resume,
// run directory, data, engine, and the failure handling around the epochs
// (train_epochs.cpp).
#include "train/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "config/config_diff.h"
#include "core/error.h"
#include "core/format.h"
#include "io/run_dir.h"
#include "train/metrics.h"
#include "train/train_run.h"

namespace fs = std::filesystem;

namespace mpx {

namespace train_detail {

namespace {

Config strip_layer_dtypes(Config c) {
  std::function<void(std::vector<LayerConfig>&)> strip = [&](std::vector<LayerConfig>& ls) {
    for (auto& l : ls) {
      l.dtype.reset();
      strip(l.layers);
    }
  };
  strip(c.model.layers);
  return c;
}

std::string loss_scaling_text(const Config& cfg) {
  const LossScaleConfig& ls = cfg.loss_scale;
  std::string detail;
  if (ls.mode == LossScaleMode::Dynamic)
    detail = fmt::format(" (initial {}, x{} every {} finite steps, x{} on overflow, min {}, stop after {} skips in a row)",
                         format_scale(ls.initial), ls.growth_factor, ls.growth_interval, ls.backoff_factor,
                         format_scale(ls.min_scale), ls.max_consecutive_skips);
  else if (ls.mode == LossScaleMode::Fixed)
    detail = fmt::format(" (S = {})", format_scale(ls.initial));
  return fmt::format("loss scaling: {}{}", loss_scale_mode_name(ls.mode), detail);
}

/// `key` is `allowed` or lies under it ("train" allows "train.epochs", "model.layers[0]" its keys).
bool key_allowed(const std::string& key, const std::string& allowed) {
  if (key == allowed) return true;
  return key.size() > allowed.size() && key.compare(0, allowed.size(), allowed) == 0 &&
         (key[allowed.size()] == '.' || key[allowed.size()] == '[');
}

/// --resume: the config against the run's own config.yaml (README, "Resuming a run").
void check_resume_config(const Config& cfg, const TrainOptions& opts) {
  const Config saved = load_config(opts.resume_config);
  std::vector<ConfigDifference> refused;
  for (const ConfigDifference& d : config_differences(saved, cfg)) {
    const bool allowed = std::any_of(opts.allow_changes.begin(), opts.allow_changes.end(),
                                     [&](const std::string& a) { return key_allowed(d.key, a); });
    if (resume_neutral_key(d.key) || allowed)
      spdlog::info("resume: {} changes from {} to {}{}", d.key, d.a, d.b, allowed ? " (--allow-changes)" : "");
    else
      refused.push_back(d);
  }
  if (refused.empty()) return;
  std::string list, keys;
  for (const ConfigDifference& d : refused) {
    list += fmt::format("{}{} ({} in the run, {} now)", list.empty() ? "" : ", ", d.key, d.a, d.b);
    keys += " " + d.key;
  }
  throw ConfigError(fmt::format(
      "--resume {}: the config differs from the run's own {} in {}; a resumed run continues the same run, so "
      "these would change its result: leave out --config (and --set) to resume as the run was configured, or "
      "accept the change with --allow-changes{}",
      opts.resume, opts.resume_config, list, keys));
}

}  // namespace

void TrainRun::start() {
  if (world_ > 1) {
    ResolvedDevice rd = session_->device();
    const std::string& want = session_->given().device;
    if (rd.device.rfind("cuda:", 0) == 0 && (want == "auto" || want == "cuda")) {
      const int n = std::max(1, cuda_device_count());
      rd.device = fmt::format("cuda:{}", comm_.local_rank() % n);
      rd.reason += fmt::format("; rank {} (local rank {}) takes {}", rank_, comm_.local_rank(), rd.device);
      session_->set_device(rd);
    }
  }
  all_ranks("starting the backend", [&] { session_->start_backend(); });
  all_ranks("reading the checkpoint to resume", [&] {
    if (opts_.resume.empty()) return;
    resume_path_ = resolve_checkpoint_path(opts_.resume);
    resume_ = load_checkpoint(resume_path_);
    const int64_t ws = resume_->header.world_size;
    if (ws != world_)
      throw ConfigError(fmt::format("checkpoint '{}' was written by a run of {} rank{}, this run has {}: resume "
                                    "with the same number of ranks (mpirun -np {})",
                                    resume_path_, ws, ws == 1 ? "" : "s", world_, ws));
  });
  if (!opts_.resume_config.empty()) all_ranks("checking the config against the run's", [&] {
    check_resume_config(cfg(), opts_);
  });
  // The run directory: --run-dir; else, when resuming from <run>/checkpoints/x.ckpt, that run's
  // directory (metrics.jsonl and train.log are appended to); else runs/<name>-<timestamp>.
  run_dir_ = opts_.run_dir;
  if (run_dir_.empty() && resume_) {
    const fs::path ck_dir = fs::path(resume_path_).parent_path();
    if (ck_dir.filename() == "checkpoints") run_dir_ = ck_dir.parent_path().string();
  }
  if (run_dir_.empty()) run_dir_ = default_run_dir(cfg().name);
  append_ = resume_ && fs::exists(fs::path(run_dir_) / "metrics.jsonl");
  all_ranks("creating the run directory", [&] {
    if (!rank0_) return;  // only rank 0 writes the run directory
    // The run-directory rule (README, "The run directory"): new or empty folders are used, a
    // foreign one is refused, a previous run only with --resume or --overwrite.
    lock_ = open_run_dir(run_dir_, resume_ ? RunDirUse::Resume : opts_.overwrite ? RunDirUse::Overwrite : RunDirUse::New);
    for (const std::string& f : remove_orphan_temp_files(run_dir_))
      spdlog::info("removed '{}', left by a run that was killed while writing it", f);
  });
  ckpt_dir_ = (fs::path(run_dir_) / "checkpoints").string();
  result_.run_dir = run_dir_;
  result_.policy = policy_name(cfg().policy);
  result_.device = session_->device().device;
  result_.eval_policy = cfg().train.eval_policy == EvalPolicy::Float32 ? "float32" : policy_name(cfg().policy);
  result_.final_loss_scale = cfg().loss_scale.mode == LossScaleMode::None ? 1.0 : cfg().loss_scale.initial;
  log_ = std::make_unique<RunLog>(run_dir_, rank0_, rank0_ && opts_.progress && ::isatty(STDERR_FILENO) != 0);
}

void TrainRun::prepare() {
  const Config& c = cfg();
  if (rank0_) write_file_atomic((fs::path(run_dir_) / "config.yaml").string(), to_yaml(c));
  spdlog::info("run directory: {}{}", run_dir_, resume_ ? " (resumed from " + resume_path_ + ")" : "");
  spdlog::info("{}: {}", session_->device().reason, be().info().description);
  if (world_ > 1) {
    // Each rank's device, gathered on rank 0: slot r holds 0 for the CPU, 1 + N for cuda:N.
    const std::string& dev = session_->device().device;
    std::vector<double> devs(static_cast<size_t>(world_), 0.0);
    if (dev.rfind("cuda:", 0) == 0) devs[static_cast<size_t>(rank_)] = 1.0 + std::stoi(dev.substr(5));
    comm_.all_reduce_sum(devs.data(), devs.size());
    std::string list;
    for (int r = 0; r < world_; ++r) {
      const int d = static_cast<int>(devs[static_cast<size_t>(r)]);
      list += fmt::format("{}rank {} {}", r ? ", " : "", r, d == 0 ? std::string("cpu") : fmt::format("cuda:{}", d - 1));
    }
    spdlog::info("data parallel: world size {} ({}), this is rank {} (local rank {}); devices: {}", world_,
                 comm_.kind(), rank_, comm_.local_rank(), list);
    if (dev.rfind("cuda:", 0) == 0 && built_with_nccl())
      all_ranks("starting NCCL", [&] { nccl_ = make_nccl_communicator(comm_, std::stoi(dev.substr(5))); });
  }
  spdlog::info("{}", session_->policy_reason());
  spdlog::info("{}", loss_scaling_text(c));
  for (const auto& w : session_->warnings()) spdlog::warn("{}", w);

  // Data: every rank reads the whole data set and takes its shard of each global batch.
  all_ranks("loading the data", [&] { session_->load_data(DataNeed::TrainAndTest); });
  loader_ = std::make_unique<Loader>(session_->train_data(), c.data.batch_size, c.data.shuffle, c.data.drop_last,
                                     c.data.augment, c.seed, rank_, world_);
  steps_per_epoch_ = loader_->steps_per_epoch();
  if (steps_per_epoch_ <= 0)
    throw ConfigError(fmt::format("data.drop_last with batch_size {} leaves no batch of the {} training records",
                                  c.data.batch_size, session_->train_data().size()));
  build_engine();
  restore_or_broadcast();
  start_lookahead();
  log_plan();
  if (append_ && rank0_) {
    const std::string metrics = (fs::path(run_dir_) / "metrics.jsonl").string();
    const int dropped = trim_metrics_for_resume(metrics, resume_->header.epoch, resume_->header.global_step);
    if (dropped > 0)
      spdlog::info("{}: dropped {} record{} written after the checkpoint (the resumed run writes them again)",
                   metrics, dropped, dropped == 1 ? "" : "s");
  }
  log_->open_metrics(append_);
  if (c.train.tensorboard) log_->open_tensorboard();
}

void TrainRun::build_engine() {
  const Config& c = cfg();
  all_ranks("building the model", [&] {
    engine_ = std::make_unique<Engine>(c, c.policy, be(), session_->make_model(local_batch_), c.loss_scale.mode,
                                       &comm_, local_batch_, nccl_.get());
    Model& m = engine_->model();
    if (resume_) {
      m.init_params(c.seed);  // --resume restores its own weights
    } else {
      const std::string from = session_->init_weights(m);  // weights.init_from (weights/weights.h)
      if (!c.weights.init_from.empty()) spdlog::info("weights: {}", from);
    }
  });
  if (c.train.eval_policy == EvalPolicy::Float32 && !engine_->model().compute_copy().empty())
    eval_model_ = session_->make_model(local_batch_, Policy::Float32, strip_layer_dtypes(c));
  const double base_lr = c.optimizer.learning_rate *
                         (c.optimizer.scale_lr_by_batch ? static_cast<double>(c.data.batch_size) / 256.0 : 1.0);
  sched_ = std::make_unique<LrSchedule>(c.schedule, base_lr, c.train.epochs, steps_per_epoch_);
}

void TrainRun::restore_or_broadcast() {
  Model& model = engine_->model();
  if (resume_) {
    all_ranks("restoring the checkpoint",
              [&] { st_ = restore_checkpoint(*resume_, resume_path_, cfg(), steps_per_epoch_, parts()); });
    result_.final_train_loss = st_.final_train_loss;
    result_.final_train_accuracy = st_.final_train_accuracy;
    // A checkpoint after steps has their train figures; one after an evaluation (a test
    // loss is > 0) its test figures.
    train_measured_ = st_.global_step > 0;
    test_measured_ = st_.last_test_loss > 0;
    result_.best_validation_accuracy = st_.best_val_accuracy;
    result_.final_validation_accuracy = st_.last_val_accuracy;
    result_.final_validation_loss = st_.last_val_loss;
    result_.stopped_early_epoch = st_.stopped_early_epoch;
    if (st_.early_stopped) stop_kind_ = "early_stopped";  // it ended there: only the final evaluation is left
    if (resume_->header.policy != policy_name(cfg().policy))
      spdlog::info("the checkpoint was written under policy {}, training continues under {}", resume_->header.policy,
                   policy_name(cfg().policy));
    spdlog::info("resuming at epoch {}, step {} of the epoch (global step {}, optimizer iteration {}, loss scale {})",
                 st_.epoch + 1, st_.step_in_epoch, st_.global_step, engine_->optimizer().iterations(),
                 format_scale(engine_->scaler().scale()));
  }
  result_.epochs = st_.epoch;
  result_.steps = st_.global_step;
  result_.best_test_accuracy = st_.best_test_accuracy;
  result_.final_test_accuracy = st_.last_test_accuracy;
  result_.final_test_loss = st_.last_test_loss;
  if (world_ > 1) {
    // Every rank starts from rank 0's weights and batch-norm statistics (they are equal already when
    // initialisation is deterministic; this makes it a guarantee, as DDP does).
    for (const Tensor& t : {model.master(), model.state()}) {
      if (t.empty() || t.numel() == 0) continue;
      std::vector<float> v(static_cast<size_t>(t.numel()));
      be().download(v.data(), t);
      comm_.broadcast(v.data(), v.size() * sizeof(float), 0);
      be().upload(t, v.data());
    }
    model.refresh_compute_copy();
  }
}

void TrainRun::log_plan() {
  const Config& c = cfg();
  Model& model = engine_->model();
  const Dataset& train = session_->train_data();
  result_.memory = model.memory_report();
  result_.optimizer_state_bytes = engine_->optimizer().state_bytes();
  spdlog::info("model:\n{}", model.summary_table());
  const bool stops_early = c.train.max_steps > 0 && c.train.max_steps < c.train.epochs * steps_per_epoch_;
  result_.validation_records = session_->validation_data().size();
  spdlog::info("data: {} train {} records{}, test {} records of {}x{}x{}; batch {}, {} steps/epoch, {} epoch{}{}",
               c.data.dataset, train.size(),
               session_->has_validation()
                   ? fmt::format(" (validation: {} more held out, seed {}; the test split is read at the end only)",
                                 session_->validation_data().size(), c.seed)
                   : std::string(),
               session_->test_data().size(), train.H, train.W, train.C,
               c.data.batch_size, steps_per_epoch_, c.train.epochs, c.train.epochs == 1 ? "" : "s",
               stops_early ? fmt::format("; stopping after {} steps (train.max_steps)", c.train.max_steps)
                           : std::string());
  if (world_ > 1) {
    spdlog::info("data parallel: {} records per rank of each global batch of {}; one all-reduce ({}) of {} of "
                 "float32 gradients per step, still loss-scaled; batch-norm statistics stay per rank (rank 0's "
                 "are checkpointed); test evaluation sharded over the ranks",
                 local_batch_, c.data.batch_size, engine_->sync().path(),
                 format_bytes(static_cast<size_t>(model.num_params()) * 4));
    if (!engine_->sync().overlap_description().empty())
      spdlog::info("data parallel: {}", engine_->sync().overlap_description());
  }
  spdlog::info("step: {}", engine_->stepper().description());
  const MemoryReport& m = result_.memory;
  spdlog::info("optimizer: {} learning rate {:g}, schedule {}; memory: master {}, grads {}, compute copy {}, "
               "optimizer state {}, activations {}",
               c.optimizer.name, sched_->base_lr(), c.schedule.name, format_bytes(m.master_bytes),
               format_bytes(m.grad_bytes), format_bytes(m.compute_copy_bytes),
               format_bytes(result_.optimizer_state_bytes), format_bytes(m.activation_bytes));
}

void TrainRun::save(const std::string& name, int64_t epoch, int64_t step) {
  if (!rank0_) return;  // rank 0 holds the same weights and state as every rank
  const std::string path = ckpt_dir_ + "/" + name;
  const double wall = st_.prior_wall_seconds + seconds_since(t_start_);
  save_checkpoint(path, make_checkpoint(cfg(), {session_->device().device, world_}, st_, epoch, step, wall, parts()));
  // Epochs counted as the "epoch N/M done" lines count them (1-based).
  if (step == 0)
    spdlog::info("saved {} (after epoch {}, global step {})", path, epoch, st_.global_step);
  else
    spdlog::info("saved {} (in epoch {} after its step {}, global step {})", path, epoch + 1, step, st_.global_step);
}

EvalResult TrainRun::evaluate(bool validation) {
  Model& model = engine_->model();
  Model* m = &model;
  if (eval_model_) {
    if (model.num_params() > 0) be().copy(eval_model_->master(), model.master());
    if (model.num_state() > 0) be().copy(eval_model_->state(), model.state());
    eval_model_->refresh_compute_copy();
    m = eval_model_.get();
  }
  return evaluate_model(be(), *m, engine_->buffers(), validation ? session_->validation_data() : session_->test_data(),
                        &comm_, nullptr, cfg().train.tta);
}

void TrainRun::absorb(const StepOutcome& o) {
  // The sums of one step, or of the steps one flush() read back, into the epoch and the log window.
  st_.sums.skipped += o.skipped;
  if (o.counted <= 0) return;
  st_.sums.loss_sum += o.loss_sum;
  st_.sums.correct += static_cast<int64_t>(std::llround(o.correct));
  st_.sums.count += o.counted;
  win_loss_ += o.loss_sum;
  win_correct_ += o.correct;
  win_count_ += o.counted;
  check_loss_growth(o.loss_sum / static_cast<double>(o.counted));
}

void TrainRun::check_loss_growth(double loss) {
  // A finite loss that has grown far past where the run started is a blow-up under any policy
  // (a non-finite one is caught by the step itself): docs/precision.md, "When training stops".
  if (!std::isfinite(loss)) return;
  if (st_.start_loss <= 0) {
    st_.start_loss = loss;
    return;
  }
  const double factor = cfg().train.divergence_factor;
  if (factor <= 0 || loss <= factor * st_.start_loss) return;
  result_.steps = st_.global_step;
  throw DivergedError(fmt::format(
      "training diverged: the train loss reached {:.4g} after {} steps under policy {}, more than {:g} times "
      "its starting value {:.4g} (train.divergence_factor); try a lower optimizer.learning_rate (a tenth of "
      "{:g}) or a warm-up (schedule.warmup_epochs: 1); train.divergence_factor: 0 turns this check off",
      loss, st_.global_step, policy_name(cfg().policy), factor, st_.start_loss, cfg().optimizer.learning_rate));
}

TrainResult TrainRun::run() {
  start();
  try {
    prepare();
    run_epochs();
    finish();
  } catch (const DivergedError& e) {
    if (world_ > 1) collective_failure_ = true;  // every rank reaches it at the same step (shared verdicts)
    record_failure("diverged", kExitDiverged, e.what());
  } catch (const Error& e) {
    record_failure("failed", e.exit_code(), e.what());
  } catch (const std::bad_alloc&) {
    record_failure("failed", kExitInternal, "out of host memory");
  } catch (const std::exception& e) {
    record_failure("failed", kExitInternal, std::string("internal error: ") + e.what());
  }
  finalize();
  return result_;
}

}  // namespace train_detail

TrainResult train(const Config& cfg, const TrainOptions& opts) { return train_detail::TrainRun(cfg, opts).run(); }

bool resume_neutral_key(const std::string& key) {
  static const char* const kNeutral[] = {"name",           "train.log_every", "train.checkpoint_every",
                                         "train.tensorboard", "train.max_steps", "debug.check_numerics"};
  return std::any_of(std::begin(kNeutral), std::end(kNeutral), [&](const char* k) { return key == k; });
}

std::string resume_run_dir(const std::string& resume) {
  std::error_code ec;
  fs::path p(resume);
  if (!fs::is_directory(p, ec)) {
    p = p.parent_path();
    if (p.filename() != "checkpoints") return "";
  }
  if (p.filename() == "checkpoints" || (p.filename().empty() && p.parent_path().filename() == "checkpoints"))
    p = (p.filename().empty() ? p.parent_path() : p).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace mpx
