// SPDX-License-Identifier: MIT
// `mpx train`'s epoch loop (train_run.h): steps, log lines and metrics records,
// end-of-epoch evaluation and checkpoints, stopping, and the summary.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "train/lookahead.h"
#include "train/metrics.h"
#include "train/train_run.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mpx::train_detail {

void TrainRun::log_step(double lr, int64_t epoch_images, double epoch_seconds) {
  const Config& c = cfg();
  const LossScaler& scaler = engine_->scaler();
  const int64_t epochs = c.train.epochs, max_steps = c.train.max_steps;
  const int64_t log_every = std::max<int64_t>(1, c.train.log_every);
  const int64_t pos = loader_->position();
  const double avg_step = run_train_seconds_ / static_cast<double>(std::max<int64_t>(1, run_images_)) *
                          static_cast<double>(c.data.batch_size);
  const int64_t total_steps =
      max_steps > 0 ? std::min(max_steps, epochs * steps_per_epoch_) : epochs * steps_per_epoch_;
  const double eta = avg_step * static_cast<double>(std::max<int64_t>(0, total_steps - st_.global_step));
  if (st_.global_step % log_every == 0) {
    const double win_s = seconds_since(t_win_);
    StepRecord r;
    r.epoch = st_.epoch, r.epochs = epochs, r.pos = pos, r.steps_per_epoch = steps_per_epoch_;
    r.global_step = st_.global_step;
    r.loss = win_count_ ? win_loss_ / static_cast<double>(win_count_) : std::nan("");
    r.accuracy = win_count_ ? win_correct_ / static_cast<double>(win_count_) : std::nan("");
    r.lr = lr;
    r.loss_scale = scaler.scale();
    r.skipped_total = scaler.state().skipped_total;
    r.images_per_sec = win_s > 0 ? static_cast<double>(win_images_) / win_s : 0.0;
    r.eta_seconds = eta;
    r.memory_bytes = be().memory_stats().current_bytes;
    log_->step(r);
    win_loss_ = win_correct_ = 0;
    win_count_ = win_images_ = 0;
    t_win_ = Clock::now();
  }
  if (!log_->progress_on()) return;  // no formatting on the step's path without a terminal
  const double l = st_.sums.count ? st_.sums.loss() : std::nan("");
  const double a = st_.sums.count ? st_.sums.accuracy() : std::nan("");
  // The bar follows train.max_steps where it ends the run first, else the epoch.
  const bool by_steps = max_steps > 0 && max_steps < epochs * steps_per_epoch_;
  const int64_t done = by_steps ? st_.global_step : pos, whole = by_steps ? max_steps : steps_per_epoch_;
  constexpr int kBar = 20;
  const int filled = static_cast<int>(std::min<int64_t>(kBar, done * kBar / std::max<int64_t>(1, whole)));
  const std::string bar = "[" + std::string(static_cast<size_t>(filled), '#') + std::string(kBar - filled, '.') + "]";
  const std::string where = by_steps ? fmt::format("step {}/{} {} epoch {}/{}", done, whole, bar, st_.epoch + 1, epochs)
                                     : fmt::format("epoch {}/{} {} {}/{}", st_.epoch + 1, epochs, bar, done, whole);
  log_->progress(fmt::format("{} loss {:.4f} acc {:.4f} lr {:.3g} scale {} {:.0f} img/s {:.1f} ms/step ETA {}", where,
                             l, a, lr, format_scale(scaler.scale()),
                             epoch_seconds > 0 ? static_cast<double>(epoch_images) / epoch_seconds : 0.0,
                             avg_step * 1000.0, format_duration(eta)));
}

bool TrainRun::run_steps(int64_t& epoch_images, double& epoch_seconds) {
  const Config& c = cfg();
  const int64_t log_every = std::max<int64_t>(1, c.train.log_every), max_steps = c.train.max_steps;
  Batch batch;
  while (loader_->next(batch)) {
    const auto t_step = Clock::now();
    // train.target_accuracy's clock starts with the run's first step (kept across resumes).
    if (st_.first_step_wall < 0) st_.first_step_wall = st_.prior_wall_seconds + seconds_since(t_start_);
    const double lr = sched_->lr(st_.global_step);
    StepOutcome o;
    try {
      o = engine_->step(batch.images.data(), batch.labels.data(), batch.n, batch.global_n, lr, st_.global_step);
    } catch (const DivergedError&) {
      result_.steps = st_.global_step + 1;  // the step ran (and was the last straw)
      throw;
    }
    ++st_.global_step;
    epoch_images += o.n;
    run_images_ += o.n;
    win_images_ += o.n;
    // train.sync "log": the results of the steps since the last read come at log lines, at
    // the end of the epoch and when stopping (the read waits for the device).
    if (o.pending && (st_.global_step % log_every == 0 || loader_->position() >= steps_per_epoch_ ||
                      stop_requested().load() || (max_steps > 0 && st_.global_step >= max_steps))) {
      try {
        o = engine_->flush();
      } catch (const DivergedError&) {
        result_.steps = st_.global_step;
        throw;
      }
    }
    const double dt = seconds_since(t_step);
    epoch_seconds += dt;
    run_train_seconds_ += dt;
    if (!o.pending) absorb(o);
    // train.lookahead (docs/fast-cifar.md), after the step is read back.
    const int64_t every = c.train.lookahead.every;
    if (every > 0 && st_.global_step % every == 0)
      lookahead(lookahead_decay(c.train.lookahead, st_.global_step, c.train.epochs * steps_per_epoch_));
    const LossScaler& scaler = engine_->scaler();
    result_.steps = st_.global_step;
    result_.skipped_steps = scaler.state().skipped_total;
    result_.final_loss_scale = scaler.scale();
    result_.last_skip_reason = skip_reason_name(scaler.state().last_skip_reason);
    log_step(lr, epoch_images, epoch_seconds);
    if (world_ > 1 ? o.stop : stop_requested().load()) {
      stop_kind_ = "interrupted";
      return false;
    }
    if (max_steps > 0 && st_.global_step >= max_steps) {
      stop_kind_ = "max_steps";
      return false;
    }
  }
  return true;
}

void TrainRun::run_epochs() {
  const Config& c = cfg();
  const int64_t epochs = c.train.epochs, max_steps = c.train.max_steps;
  while (stop_kind_.empty() && st_.epoch < epochs && !(max_steps > 0 && st_.global_step >= max_steps)) {
    loader_->start_epoch(st_.epoch, st_.step_in_epoch);
    engine_->optimizer().set_epoch(st_.epoch);
    // No gradient is carried into leading layers that this epoch leaves alone (a frozen
    // whitening layer): the same updates, less work (docs/fast-cifar.md, "Parameter groups").
    const Optimizer& opt = engine_->optimizer();
    engine_->model().set_updated_params([&opt](const ParamInfo& p) { return opt.updates(p.offset); });
    const auto t_epoch = Clock::now();
    double epoch_seconds = 0;
    int64_t epoch_images = 0;
    win_loss_ = win_correct_ = 0;
    win_count_ = win_images_ = 0;
    t_win_ = Clock::now();
    run_steps(epoch_images, epoch_seconds);
    log_->clear_progress();
    // Not expected (every way out of the loop reads back), but never lose steps.
    if (engine_->pending()) absorb(engine_->flush());

    const bool epoch_done = loader_->position() >= steps_per_epoch_;
    if (stop_kind_ == "interrupted" && !epoch_done) {
      // Save the exact position (mid-epoch); the partial epoch's sums go into the checkpoint.
      save("last.ckpt", st_.epoch, loader_->position());
      return;
    }
    st_.final_train_loss = result_.final_train_loss = st_.sums.loss();
    st_.final_train_accuracy = result_.final_train_accuracy = st_.sums.accuracy();
    train_measured_ = train_measured_ || st_.sums.count > 0;
    if (!epoch_done) return;  // max_steps inside the epoch
    // A complete epoch, also when a stop arrived after its last step: its evaluation, metrics
    // record, best checkpoint and plateau step happen before stopping, so that the resumed run
    // continues exactly where an uninterrupted one would.
    const bool saved = end_epoch(t_epoch, epoch_images, epoch_seconds);
    if (stop_kind_ == "interrupted" && !saved) save("last.ckpt", st_.epoch, 0);
  }
}

bool TrainRun::end_epoch(Clock::time_point t_epoch, int64_t epoch_images, double epoch_seconds) {
  const Config& c = cfg();
  const LossScaler& scaler = engine_->scaler();
  const double train_loss = st_.sums.loss(), train_acc = st_.sums.accuracy();
  result_.epochs = ++st_.epoch;
  const int64_t epoch = st_.epoch, epochs = c.train.epochs, max_steps = c.train.max_steps;
  const bool last_epoch = epoch >= epochs || (max_steps > 0 && st_.global_step >= max_steps);
  const bool do_eval = last_epoch || (c.train.eval_every > 0 && epoch % c.train.eval_every == 0);
  // train.lookahead: training ends on the averaged weights (decay 1: the trained ones take their value).
  if (last_epoch && c.train.lookahead.every > 0) lookahead(1.0);
  json rec = {{"kind", "epoch"},
              {"epoch", epoch},
              {"step", st_.global_step},
              {"train_loss", json_number(train_loss)},
              {"train_accuracy", train_acc},
              {"test_loss", nullptr},
              {"test_accuracy", nullptr},
              {"learning_rate", sched_->lr(std::max<int64_t>(0, st_.global_step - 1))},
              {"loss_scale", scaler.scale()},
              {"skipped_steps", scaler.state().skipped_total},
              {"epoch_skipped_steps", st_.sums.skipped},
              {"last_skip_reason", skip_reason_name(scaler.state().last_skip_reason)},
              {"images_per_sec", epoch_seconds > 0 ? static_cast<double>(epoch_images) / epoch_seconds : 0.0},
              {"wall_seconds", st_.prior_wall_seconds + seconds_since(t_start_)}};
  bool improved = false, stop_early = false;
  std::string eval_text;
  const bool val = session_->has_validation();
  if (do_eval && val) {
    // The validation split chooses the best checkpoint, drives reduce_on_plateau and early
    // stopping; the test split is evaluated once, at the end (finish()).
    const EvalResult ev = evaluate(true);
    const double best = st_.best_val_accuracy;
    // best.ckpt: the best validation accuracy, or, with early stopping, the best of its monitored
    // figure (the weights restore_best goes back to, as Keras' restore_best_weights).
    bool monitor_improved = false;
    stop_early = early_stop_after(ev, epoch, monitor_improved);
    improved = c.train.early_stopping.monitor != EarlyStopMonitor::None
                   ? monitor_improved
                   : ev.accuracy > best || (best == 0 && !fs::exists(ckpt_dir_ + "/best.ckpt"));
    st_.last_val_accuracy = result_.final_validation_accuracy = ev.accuracy;
    st_.last_val_loss = result_.final_validation_loss = ev.loss;
    st_.best_val_accuracy = result_.best_validation_accuracy = std::max(best, ev.accuracy);
    rec["validation_loss"] = json_number(ev.loss);
    rec["validation_accuracy"] = ev.accuracy;
    if (sched_->on_eval(ev.loss))
      spdlog::info("reduce_on_plateau: validation loss has not improved for {} evaluations; learning rate -> {:g}",
                   c.schedule.patience, sched_->state().plateau_lr);
    eval_text = fmt::format(", validation loss {:.4f} acc {:.4f} (best {:.4f}{})", ev.loss, ev.accuracy,
                            st_.best_val_accuracy, c.train.eval_policy == EvalPolicy::Float32 ? ", float32 eval" : "");
  } else if (do_eval) {
    const EvalResult ev = evaluate();
    const double best = st_.best_test_accuracy;
    improved = ev.accuracy > best || (best == 0 && !fs::exists(ckpt_dir_ + "/best.ckpt"));
    st_.last_test_accuracy = result_.final_test_accuracy = ev.accuracy;
    st_.last_test_loss = result_.final_test_loss = ev.loss;
    st_.best_test_accuracy = result_.best_test_accuracy = std::max(best, ev.accuracy);
    rec["test_loss"] = json_number(ev.loss);
    rec["test_accuracy"] = ev.accuracy;
    test_measured_ = true;
    result_.num_classes = ev.num_classes;
    result_.confusion = ev.confusion;
    if (sched_->on_eval(ev.loss))
      spdlog::info("reduce_on_plateau: test loss has not improved for {} evaluations; learning rate -> {:g}",
                   c.schedule.patience, sched_->state().plateau_lr);
    evaluated_at_end_ = last_epoch;
    eval_text = fmt::format(", test loss {:.4f} acc {:.4f} (best {:.4f}{})", st_.last_test_loss, st_.last_test_accuracy,
                            st_.best_test_accuracy, c.train.eval_policy == EvalPolicy::Float32 ? ", float32 eval" : "");
  }
  const bool at_target = do_eval && reach_target(val ? st_.last_val_accuracy : st_.last_test_accuracy, epoch, rec);
  if (at_target && c.train.stop_at_target) {
    stop_kind_ = "target_reached";
    if (!val) evaluated_at_end_ = true;  // this epoch's test evaluation is the run's last
  }
  const int64_t skipped = st_.sums.skipped;
  spdlog::info("epoch {}/{} done in {}: train loss {:.4f} acc {:.4f}{}; {:.0f} img/s, loss scale {}, {} skipped "
               "steps this epoch{}",
               epoch, epochs, format_duration(seconds_since(t_epoch)), train_loss, train_acc, eval_text,
               rec["images_per_sec"].get<double>(), format_scale(scaler.scale()), skipped,
               skipped ? std::string(", last reason ") + skip_reason_name(scaler.state().last_skip_reason)
                       : std::string());
  log_->record(rec);
  st_.sums = EpochSums{};
  st_.step_in_epoch = 0;
  if (improved) save("best.ckpt", epoch, 0);
  if (stop_early) stop_kind_ = "early_stopped";
  const bool save_last = last_epoch || stop_early || stop_kind_ == "target_reached" ||
                         (c.train.checkpoint_every > 0 && epoch % c.train.checkpoint_every == 0);
  if (save_last) save("last.ckpt", epoch, 0);
  log_->flush();
  check_train_loss_plateau(train_loss, epoch);
  return save_last;
}

void TrainRun::finish() {
  if (stop_kind_ == "interrupted") {
    result_.status = "interrupted";
    result_.exit_code = kExitInterrupted;
    result_.message = fmt::format("interrupted after step {}; last.ckpt saved, continue with --resume {}",
                                  st_.global_step, run_dir_);
    spdlog::info("{}", result_.message);
    return;
  }
  if (stop_kind_ == "early_stopped" && cfg().train.early_stopping.restore_best) {
    const std::string best = ckpt_dir_ + "/best.ckpt";
    all_ranks("restoring the best weights", [&] {
      if (!fs::exists(best)) return;  // never improved on the first evaluation: nothing better to go back to
      const Checkpoint ck = load_checkpoint(best);
      restore_model(be(), engine_->model(), ck, best, cfg());
      spdlog::info("early stopping: restored the weights of {} (epoch {}, the best validation evaluation)", best,
                   ck.header.epoch);
    });
  }
  if (!evaluated_at_end_) {
    const EvalResult ev = evaluate();
    st_.last_test_accuracy = result_.final_test_accuracy = ev.accuracy;
    st_.last_test_loss = result_.final_test_loss = ev.loss;
    st_.best_test_accuracy = result_.best_test_accuracy = std::max(st_.best_test_accuracy, ev.accuracy);
    spdlog::info("final evaluation: test loss {:.4f} acc {:.4f}", ev.loss, ev.accuracy);
    test_measured_ = true;
    result_.num_classes = ev.num_classes;
    result_.confusion = ev.confusion;
    if (stop_kind_ == "max_steps") {
      const LossScaler& scaler = engine_->scaler();
      log_->record({{"kind", "epoch"},
                    {"epoch", st_.epoch + 1},
                    {"partial", true},
                    {"step", st_.global_step},
                    {"train_loss", json_number(result_.final_train_loss)},
                    {"train_accuracy", result_.final_train_accuracy},
                    {"test_loss", json_number(ev.loss)},
                    {"test_accuracy", ev.accuracy},
                    {"learning_rate", sched_->lr(std::max<int64_t>(0, st_.global_step - 1))},
                    {"loss_scale", scaler.scale()},
                    {"skipped_steps", scaler.state().skipped_total},
                    {"last_skip_reason", skip_reason_name(scaler.state().last_skip_reason)},
                    {"images_per_sec",
                     run_train_seconds_ > 0 ? static_cast<double>(run_images_) / run_train_seconds_ : 0.0},
                    {"wall_seconds", st_.prior_wall_seconds + seconds_since(t_start_)}});
      save("last.ckpt", st_.epoch, loader_->position() >= steps_per_epoch_ ? 0 : loader_->position());
    }
  }
  result_.status = "completed";
  result_.exit_code = kExitOk;
  result_.message.clear();
}

void TrainRun::record_failure(const std::string& status, int code, const std::string& message) {
  result_.status = status;
  result_.exit_code = code;
  result_.message = message;
}

void TrainRun::finalize() {
  log_->clear_progress();
  if (result_.exit_code != kExitOk && result_.exit_code != kExitInterrupted) spdlog::error("{}", result_.message);
  if (world_ > 1 && result_.status == "completed" && engine_) {
    // The loss scale and skip count must be the same on every rank (docs/distributed.md): check it once.
    double v[2] = {engine_->scaler().scale(), static_cast<double>(engine_->scaler().state().skipped_total)};
    const double mine[2] = {v[0], v[1]};
    comm_.all_reduce_sum(v, 2);
    if (v[0] != mine[0] * world_ || v[1] != mine[1] * world_) {
      spdlog::error("internal error: the ranks disagree on the loss scale or the skipped steps");
      record_failure("failed", kExitInternal, result_.message);
    } else {
      spdlog::info("all {} ranks agree: loss scale {}, {} skipped steps", world_,
                   format_scale(engine_->scaler().scale()), engine_->scaler().state().skipped_total);
    }
  }
  if (engine_ && engine_->pending()) {
    // Steps queued under train.sync "log" when a failure ended the loop: their counters still count.
    try {
      engine_->flush();
    } catch (const std::exception& e) {
      spdlog::debug("reading the last steps back: {}", e.what());
    }
  }
  if (engine_) {
    const LossScalerState& s = engine_->scaler().state();
    result_.skipped_steps = s.skipped_total;
    result_.final_loss_scale = s.scale;
    result_.last_skip_reason = skip_reason_name(s.last_skip_reason);
  }
  result_.wall_seconds = st_.prior_wall_seconds + seconds_since(t_start_);
  result_.target_accuracy = cfg().train.target_accuracy;
  result_.target_met = st_.target_met;
  result_.target_epoch = st_.target_epoch;
  result_.target_step = st_.target_step;
  result_.time_to_target_seconds = st_.target_seconds;
  result_.seconds_from_first_step =
      st_.first_step_wall >= 0 ? result_.wall_seconds - st_.first_step_wall : std::nan("");
  result_.images_per_sec = run_train_seconds_ > 0 ? static_cast<double>(run_images_) / run_train_seconds_ : 0.0;
  result_.peak_memory_bytes = be().memory_stats().peak_bytes;
  try {
    log_->flush();  // a train.log write that failed ends the run with exit 6 (run_dir.h)
  } catch (const Error& e) {
    if (result_.exit_code == kExitOk || result_.exit_code == kExitInterrupted) record_failure("failed", e.exit_code(), e.what());
    spdlog::error("{}", e.what());
  }
  if (rank0_) {
    TrainResult written = result_;  // what was never measured is null (sanitize), not 0
    const double unknown = std::nan("");
    if (!test_measured_) {
      written.final_test_accuracy = written.best_test_accuracy = written.final_test_loss = unknown;
      written.confusion.clear();
    }
    if (!train_measured_) written.final_train_loss = written.final_train_accuracy = unknown;
    if (run_images_ == 0) written.images_per_sec = unknown;
    if (session_->has_validation()) written.best_test_accuracy = unknown;  // the test split is read once, at the end
    try {
      write_summary((fs::path(run_dir_) / "summary.json").string(), written);
    } catch (const std::exception& e) {
      spdlog::error("cannot write summary.json: {}", e.what());
      if (result_.exit_code == kExitOk) {  // the run's record is lost: never report success
        result_.exit_code = kExitIo;
        result_.message = e.what();
      }
    }
  }
  if (result_.status == "completed")  // train.log only: `mpx train` prints its result line on stdout
    log_->file_only(fmt::format("completed: {} steps ({} full epoch{}), test accuracy {:.4f} (best {:.4f}), "
                                "{:.0f} img/s, {}",
                                result_.steps, result_.epochs, result_.epochs == 1 ? "" : "s",
                                result_.final_test_accuracy, result_.best_test_accuracy, result_.images_per_sec,
                                format_duration(result_.wall_seconds)));
  try {
    log_->flush();
  } catch (const Error& e) {
    spdlog::error("{}", e.what());  // summary.json is written: only the log's last lines are lost
  }
  if (world_ > 1 && !collective_failure_ && result_.exit_code != kExitOk && result_.exit_code != kExitInterrupted) {
    // This rank failed alone (the others may wait in a collective): end the whole job with its code.
    spdlog::error("stopping all {} ranks (exit code {})", world_, result_.exit_code);
    comm_.abort(result_.exit_code);
  }
}

}  // namespace mpx::train_detail
