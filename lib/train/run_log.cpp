// SPDX-License-Identifier: MIT
// Progress line, log lines and metrics records of a run (run_log.h).
#include "train/run_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/live_line.h"
#include "train/loss_scaler.h"

namespace mpx {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m{:02}s", t / 3600, (t / 60) % 60, t % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void Progress::show(const std::string& s) {
  if (!on_) return;
  const auto now = Clock::now();
  // At most five redraws a second; at once after a log line erased it.
  if (live_line::shown() && std::chrono::duration<double>(now - last_).count() < 0.2) return;
  last_ = now;
  live_line::show(s);
}

void Progress::clear() {
  if (on_) live_line::clear();
}

RunLog::RunLog(const std::string& dir, bool rank0, bool progress) : dir_(dir), rank0_(rank0), progress_(progress) {
  if (rank0_) file_.emplace((std::filesystem::path(dir_) / "train.log").string());
}

void RunLog::open_metrics(bool append) {
  if (rank0_) metrics_.emplace((std::filesystem::path(dir_) / "metrics.jsonl").string(), append);
}

void RunLog::open_tensorboard() {
  if (rank0_) tensorboard_.emplace(dir_);
}

void RunLog::step(const StepRecord& r) {
  const std::string line = fmt::format(
      "epoch {}/{} step {}/{} (global {}): loss {:.4f} acc {:.4f} lr {:.3g} scale {} skipped {} "
      "{:.0f} img/s ETA {}",
      r.epoch + 1, r.epochs, r.pos, r.steps_per_epoch, r.global_step, r.loss, r.accuracy, r.lr,
      format_scale(r.loss_scale), r.skipped_total, r.images_per_sec, format_duration(r.eta_seconds));
  if (progress_.on()) {
    spdlog::debug("{}", line);  // the live line shows it; train.log gets it here
    if (file_) file_->write_info(line);
  } else {
    spdlog::info("{}", line);
  }
  record({{"kind", "step"},
          {"step", r.global_step},
          {"epoch", r.epoch + 1},
          {"loss", json_number(r.loss)},
          {"accuracy", json_number(r.accuracy)},
          {"learning_rate", r.lr},
          {"loss_scale", r.loss_scale},
          {"skipped_steps", r.skipped_total},
          {"images_per_sec", r.images_per_sec},
          {"memory_bytes", r.memory_bytes}});
}

void RunLog::record(const nlohmann::json& rec) {
  if (metrics_) metrics_->write(rec);
  if (tensorboard_) tensorboard_->record(rec);
}

void RunLog::flush() {
  if (file_) file_->flush();
}

void RunLog::file_only(const std::string& line) {
  if (file_) file_->write_info(line);
}

}  // namespace mpx
