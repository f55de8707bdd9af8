// SPDX-License-Identifier: MIT
// `mpx bench` (bench.h).
#include "commands/bench.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "train/run_log.h"
#include "train/session.h"
#include "train/stepper.h"

namespace mpx {

namespace {

/// Batches for the timed steps: the loader over real data, cycling epochs, or one random batch.
class BenchInput {
 public:
  BenchInput(const Session& s, int64_t B) : B_(B) {
    const Config& cfg = s.config();
    if (s.has_train()) {
      loader_.emplace(s.train_data(), B, cfg.data.shuffle, true, cfg.data.augment, cfg.seed);
      if (loader_->steps_per_epoch() == 0) loader_.reset();
      else loader_->start_epoch(0);
    }
    if (!loader_) {
      Rng rng(cfg.seed);
      images_.resize(static_cast<size_t>(B * s.H() * s.W() * s.C()));
      labels_.resize(static_cast<size_t>(B));
      for (auto& v : images_) v = static_cast<uint8_t>(rng.uniform_int(256));
      for (auto& v : labels_) v = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(s.num_classes())));
    }
  }
  void next(const uint8_t*& x, const int32_t*& y, int64_t& n) {
    if (loader_) {
      if (!loader_->next(batch_)) {
        loader_->start_epoch(++epoch_);
        loader_->next(batch_);
      }
      x = batch_.images.data(), y = batch_.labels.data(), n = batch_.n;
    } else {
      x = images_.data(), y = labels_.data(), n = B_;
    }
  }

 private:
  int64_t B_;
  std::optional<Loader> loader_;
  Batch batch_;
  int64_t epoch_ = 0;
  std::vector<uint8_t> images_;
  std::vector<int32_t> labels_;
};

/// SIGINT/SIGTERM during a benchmark: stop now with exit 130 (nothing to save).
void check_stop(int64_t done) {
  if (stop_requested().load())
    throw InterruptedError(fmt::format("bench: interrupted after {} step{}", done, done == 1 ? "" : "s"));
}

void summarize(const std::vector<double>& ms, int64_t images, BenchResult& r) {
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  r.step_ms_median = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
  r.step_ms_min = sorted.front();
  r.step_ms_max = sorted.back();
  double total_ms = 0;
  for (double v : ms) total_ms += v;
  r.images_per_sec = total_ms > 0 ? static_cast<double>(images) / (total_ms / 1e3) : 0.0;
}

}  // namespace

BenchResult bench(const Config& cfg, int64_t steps, int64_t warmup) {
  constexpr int64_t kMax = 1000000000;  // keeps warmup + 2 * steps far from overflow
  if (steps <= 0 || steps > kMax)
    throw ConfigError(fmt::format("bench: --steps must be in [1, {}], got {}", kMax, steps));
  if (warmup < 0 || warmup > kMax)
    throw ConfigError(fmt::format("bench: --warmup must be in [0, {}], got {}", kMax, warmup));
  Session s(cfg);
  s.start_backend();
  Backend& be = s.backend();
  spdlog::info("{}; {}", s.device().reason, s.policy_reason());
  s.load_data(DataNeed::TrainIfPresent);
  if (!s.data_note().empty()) spdlog::info("bench: no data ({}); timing random inputs", s.data_note());
  const Config& rc = s.config();
  const int64_t B = rc.data.batch_size;
  std::unique_ptr<Model> model = s.make_model(B);
  model->init_params(rc.seed);
  Engine engine(rc, s.policy(), be, std::move(model), s.loss_scale_mode());
  const double lr = rc.optimizer.learning_rate;
  const int64_t log_every = std::max<int64_t>(1, rc.train.log_every);
  BenchInput input(s, B);

  std::vector<double> ms;
  int64_t images = 0;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    check_stop(i);
    const uint8_t* x;
    const int32_t* y;
    int64_t n;
    input.next(x, y, n);
    be.synchronize();
    const auto t = Clock::now();
    engine.step(x, y, n, n, lr, i);
    be.synchronize();
    if (engine.pending() && (i + 1) % log_every == 0) engine.flush();
    const double dt = seconds_since(t) * 1e3;
    if (i >= warmup) {
      ms.push_back(dt);
      images += n;
    }
  }
  BenchResult r;
  if (engine.deferred()) {
    // train.sync log: the same number of steps again as one block, synchronising only at the end
    // (the steps above wait for the device after each one, as a per-step timer must).
    if (engine.pending()) engine.flush();
    be.synchronize();
    const auto t0 = Clock::now();
    int64_t block_images = 0;
    for (int64_t i = 0; i < steps; ++i) {
      check_stop(warmup + steps + i);
      const uint8_t* x;
      const int32_t* y;
      int64_t n;
      input.next(x, y, n);
      engine.step(x, y, n, n, lr, warmup + steps + i);
      block_images += n;
      if (engine.pending() && (i + 1) % log_every == 0) engine.flush();
    }
    if (engine.pending()) engine.flush();
    be.synchronize();
    const double s_block = seconds_since(t0);
    r.images_per_sec_pipelined = s_block > 0 ? static_cast<double>(block_images) / s_block : 0.0;
  }
  summarize(ms, images, r);
  r.peak_memory_bytes = be.memory_stats().peak_bytes;
  r.policy = policy_name(s.policy());
  r.device = s.device().device;
  r.batch_size = B;
  r.steps = steps;
  r.memory = engine.model().memory_report();
  r.library = be.library();
  r.kernels = be.kernels();
  r.pieces = engine.model().piece_runs();
  r.conv_pool = engine.model().conv_pool_runs();
  r.plans = be.plans();
  r.math16 = be.math16();
  return r;
}

}  // namespace mpx
