// SPDX-License-Identifier: MIT
// The host-side parts of lib/train and lib/io that need no model: loss scaler traces,
// learning-rate schedules against hand-computed values, the checkpoint file
// format (round trip, corruption, truncation), metrics/summary writers.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/run_dir.h"
#include "support/log_capture.h"
#include "train/loss_scaler.h"
#include "train/metrics.h"
#include "train/schedule.h"

using namespace mpx;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mpx_test_train_units_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct Expect {
  bool finite;
  double scale;
  int64_t good, skipped, consecutive;
};

void run_trace(LossScaler& s, const std::vector<Expect>& trace) {
  for (size_t i = 0; i < trace.size(); ++i) {
    INFO("step " << i);
    s.update(trace[i].finite, SkipReason::BackwardOverflow);
    CHECK(s.scale() == trace[i].scale);
    CHECK(s.state().good_steps == trace[i].good);
    CHECK(s.state().skipped_total == trace[i].skipped);
    CHECK(s.state().consecutive_skips == trace[i].consecutive);
  }
}

}  // namespace

// ---- loss scaler ------------------------------------------------------------

TEST_CASE("LossScaler dynamic follows a hand-written trace", "[train][scaler]") {
  LossScaleConfig c;
  c.initial = 1024;
  c.growth_interval = 3;
  c.growth_factor = 2;
  c.backoff_factor = 0.5;
  c.min_scale = 1;
  c.max_consecutive_skips = 100;
  LossScaler s(c, LossScaleMode::Dynamic);
  CHECK(s.scale() == 1024);
  run_trace(s, {
                   {false, 512, 0, 1, 1},   // overflow: halve
                   {false, 256, 0, 2, 2},   // again
                   {true, 256, 1, 2, 0},    // finite
                   {true, 256, 2, 2, 0},
                   {true, 512, 0, 2, 0},    // 3rd finite in a row: grow, counter resets
                   {true, 512, 1, 2, 0},
                   {false, 256, 0, 3, 1},   // skip resets the counter
                   {true, 256, 1, 3, 0},
                   {true, 256, 2, 3, 0},
                   {true, 512, 0, 3, 0},
               });
  CHECK(s.state().last_skip_reason == SkipReason::BackwardOverflow);
}

TEST_CASE("LossScaler dynamic never goes below min_scale", "[train][scaler]") {
  LossScaleConfig c;
  c.initial = 8;
  c.growth_interval = 1000;
  c.min_scale = 2;
  c.max_consecutive_skips = 0;  // no divergence guard here
  LossScaler s(c, LossScaleMode::Dynamic);
  run_trace(s, {{false, 4, 0, 1, 1}, {false, 2, 0, 2, 2}, {false, 2, 0, 3, 3}, {false, 2, 0, 4, 4}, {true, 2, 1, 4, 0}});
}

TEST_CASE("LossScaler dynamic growth stops at the float32 range", "[train][scaler]") {
  LossScaleConfig c;
  c.initial = std::ldexp(1.0, 127);
  c.growth_interval = 1;
  LossScaler s(c, LossScaleMode::Dynamic);
  s.update(true);
  CHECK(s.scale() == std::ldexp(1.0, 127));
  CHECK(s.state().good_steps == 0);
}

TEST_CASE("LossScaler fixed keeps S but still skips and counts", "[train][scaler]") {
  LossScaleConfig c;
  c.initial = 128;
  c.growth_interval = 2;
  c.max_consecutive_skips = 10;
  LossScaler s(c, LossScaleMode::Fixed);
  run_trace(s, {{true, 128, 0, 0, 0}, {true, 128, 0, 0, 0}, {true, 128, 0, 0, 0}, {false, 128, 0, 1, 1},
                {false, 128, 0, 2, 2}, {true, 128, 0, 2, 0}});
}

TEST_CASE("LossScaler none has S = 1 and counts skips", "[train][scaler]") {
  LossScaleConfig c;
  c.initial = 4096;  // ignored
  LossScaler s(c, LossScaleMode::None);
  CHECK(s.scale() == 1);
  run_trace(s, {{true, 1, 0, 0, 0}, {false, 1, 0, 1, 1}, {true, 1, 0, 1, 0}});
}

TEST_CASE("LossScaler raises DivergedError after max_consecutive_skips", "[train][scaler]") {
  LossScaleConfig c;
  c.initial = 16;
  c.max_consecutive_skips = 3;
  LossScaler s(c, LossScaleMode::Dynamic);
  s.update(false, SkipReason::NonfiniteForward);
  s.update(true);
  s.update(false, SkipReason::NonfiniteLoss);
  s.update(false, SkipReason::BackwardOverflow);
  try {
    s.update(false, SkipReason::BackwardOverflow, [] { return std::string("first non-finite: gradient of layer 'conv2d_0'"); });
    FAIL("no DivergedError");
  } catch (const DivergedError& e) {
    const std::string msg = e.what();
    CHECK(e.exit_code() == 4);
    CHECK(msg.find("3 consecutive steps") != std::string::npos);
    CHECK(msg.find("conv2d_0") != std::string::npos);
    CHECK(msg.find("learning_rate") != std::string::npos);
    CHECK(msg.find("mixed_bfloat16") != std::string::npos);
    CHECK(msg.find("check_numerics") != std::string::npos);
  }
  CHECK(s.state().skipped_total == 4);
  CHECK(s.scale() == 1);  // 16 -> 8 -> (grow no) -> 4 -> 2 -> 1
}

TEST_CASE("skip reasons and scale format", "[train][scaler]") {
  for (auto r : {SkipReason::None, SkipReason::NonfiniteForward, SkipReason::NonfiniteLoss, SkipReason::BackwardOverflow})
    CHECK(parse_skip_reason(skip_reason_name(r)) == r);
  CHECK(format_scale(32768) == "2^15");
  CHECK(format_scale(1) == "2^0");
  CHECK(format_scale(0.5) == "2^-1");
  CHECK(format_scale(3) == "3");
}

// ---- schedules --------------------------------------------------------------

TEST_CASE("constant schedule with warm-up", "[train][schedule]") {
  ScheduleConfig c;
  c.name = ScheduleName::Constant;
  c.warmup_epochs = 0.5;  // 5 of 10 steps per epoch
  LrSchedule s(c, 0.1, 3, 10);
  CHECK(s.warmup_steps() == 5);
  CHECK(s.lr(0) == Approx(0.02));
  CHECK(s.lr(1) == Approx(0.04));
  CHECK(s.lr(4) == Approx(0.1));
  CHECK(s.lr(5) == Approx(0.1));
  CHECK(s.lr(29) == Approx(0.1));
}

TEST_CASE("step schedule", "[train][schedule]") {
  ScheduleConfig c;
  c.name = ScheduleName::Step;
  c.step_epochs = 2;
  c.gamma = 0.5;
  LrSchedule s(c, 1.0, 6, 4);
  CHECK(s.lr(0) == 1.0);
  CHECK(s.lr(7) == 1.0);    // epoch 1
  CHECK(s.lr(8) == 0.5);    // epoch 2
  CHECK(s.lr(15) == 0.5);   // epoch 3
  CHECK(s.lr(16) == 0.25);  // epoch 4
  CHECK(s.lr(23) == 0.25);
}

TEST_CASE("cosine schedule with warm-up", "[train][schedule]") {
  ScheduleConfig c;
  c.name = ScheduleName::Cosine;
  c.warmup_epochs = 1;
  c.min_lr = 0.01;
  LrSchedule s(c, 0.11, 3, 10);  // 30 steps, 10 of warm-up, 20 of cosine
  // warm-up ramps towards the cosine value at that step (which is the base up to W)
  CHECK(s.lr(0) == Approx(0.011));
  CHECK(s.lr(9) == Approx(0.11));
  CHECK(s.lr(10) == Approx(0.11));                            // p = 0
  CHECK(s.lr(15) == Approx(0.01 + 0.1 * 0.5 * (1 + std::cos(M_PI * 0.25))));
  CHECK(s.lr(20) == Approx(0.06));                            // p = 0.5
  CHECK(s.lr(30) == Approx(0.01));                            // p = 1
  CHECK(s.lr(40) == Approx(0.01));                            // clamped
}

TEST_CASE("triangular schedule: linear up to the peak, then down to the end", "[train][schedule]") {
  ScheduleConfig c;
  c.name = ScheduleName::Triangular;  // defaults: start 0.2, peak at 0.2 of the run, end 0
  LrSchedule s(c, 0.5, 2, 5);        // T = 10 steps, peak at K = 2
  const double want[] = {0.1, 0.3, 0.5, 0.4375, 0.375, 0.3125, 0.25, 0.1875, 0.125, 0.0625, 0.0};
  for (int t = 0; t <= 10; ++t) {
    INFO("step " << t);
    CHECK(s.lr(t) == Approx(want[t]).margin(1e-15));
  }
  CHECK(s.lr(12) == Approx(0.0).margin(1e-15));  // past the end: the end rate

  // airbench94's shape: 0.2 -> 1 at 23% -> 0.07, as numpy.interp would give it.
  c.start_factor = 0.2;
  c.peak_fraction = 0.23;
  c.end_factor = 0.07;
  LrSchedule a(c, 2.0, 10, 49);  // T = 490, K = round(112.7) = 113
  auto interp = [](double x, double x0, double y0, double x1, double y1) { return y0 + (y1 - y0) * (x - x0) / (x1 - x0); };
  for (int t : {0, 1, 57, 112, 113, 114, 300, 489, 490}) {
    const double f = t <= 113 ? interp(t, 0, 0.2, 113, 1.0) : interp(t, 113, 1.0, 490, 0.07);
    INFO("step " << t);
    CHECK(a.lr(t) == Approx(2.0 * f).epsilon(1e-12));
  }
  // A warm-up multiplies, as for every schedule.
  c.warmup_epochs = 1;
  LrSchedule w(c, 2.0, 10, 49);
  CHECK(w.lr(9) == Approx(a.lr(9) * 10.0 / 49.0).epsilon(1e-12));
}

TEST_CASE("reduce_on_plateau follows Keras ReduceLROnPlateau", "[train][schedule]") {
  ScheduleConfig c;
  c.name = ScheduleName::ReduceOnPlateau;
  c.factor = 0.5;
  c.patience = 2;
  c.min_delta = 0.01;
  c.cooldown = 1;
  c.min_lr = 0.2;
  LrSchedule s(c, 1.0, 100, 10);
  CHECK(s.lr(0) == 1.0);
  CHECK_FALSE(s.on_eval(1.0));   // best = 1.0
  CHECK_FALSE(s.on_eval(0.995)); // not better by min_delta: wait 1
  CHECK(s.on_eval(0.999));       // wait 2 >= patience: lr 0.5, cooldown 1
  CHECK(s.lr(123) == 0.5);
  CHECK(s.state().cooldown_counter == 1);
  CHECK_FALSE(s.on_eval(1.0));   // cooldown 1 -> 0, then not in cooldown: wait 1
  CHECK(s.state().wait == 1);
  CHECK(s.on_eval(1.0));         // wait 2: lr 0.25
  CHECK(s.lr(0) == 0.25);
  CHECK_FALSE(s.on_eval(0.5));   // improvement (cooldown 1 -> 0): best 0.5
  CHECK(s.state().best == 0.5);
  CHECK_FALSE(s.on_eval(0.6));
  CHECK(s.on_eval(0.6));         // 0.125 -> clamped to min_lr 0.2
  CHECK(s.lr(0) == 0.2);
  CHECK_FALSE(s.on_eval(0.6));
  CHECK_FALSE(s.on_eval(0.6));   // at min_lr: no further reduction
  CHECK(s.lr(0) == 0.2);
}

// ---- checkpoint format ------------------------------------------------------

namespace {
Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.header.config_name = "unit";
  c.header.policy = "mixed_float16";
  c.header.device = "cpu";
  c.header.optimizer = "adam";
  c.header.dataset = "synthetic";
  c.header.seed = 7;
  c.header.batch_size = 32;
  c.header.num_params = 1000;
  c.header.num_state = 6;
  c.header.epoch = 3;
  c.header.step_in_epoch = 5;
  c.header.global_step = 65;
  c.header.applied_updates = 60;
  c.header.scaler = {std::ldexp(1.0, 14), 17, 5, 0, SkipReason::BackwardOverflow};
  c.header.schedule = {0.01, std::numeric_limits<double>::infinity(), 2, 1};
  c.header.best_test_accuracy = 0.875;
  c.header.epoch_loss_sum = 12.5;
  c.header.epoch_correct = 100;
  c.header.epoch_count = 160;
  c.master.resize(1000);
  c.opt.assign(2, std::vector<float>(1000));
  c.state = {0, 1, 2, 3, 4, 5};
  for (size_t i = 0; i < 1000; ++i) {
    c.master[i] = std::sin(static_cast<float>(i)) * 1e-3f;
    c.opt[0][i] = static_cast<float>(i) * 0.5f;
    c.opt[1][i] = std::nextafter(static_cast<float>(i), 1e9f);
  }
  return c;
}
}  // namespace

TEST_CASE("checkpoint: an optimizer's state arenas of any number round-trip", "[train][checkpoint]") {
  const fs::path d = temp_dir("ckpt_arity");
  for (size_t arenas : {size_t(0), size_t(1), size_t(3), size_t(5)}) {
    Checkpoint c = sample_checkpoint();
    c.opt.assign(arenas, std::vector<float>(1000));
    for (size_t k = 0; k < arenas; ++k)
      for (size_t i = 0; i < 1000; ++i) c.opt[k][i] = static_cast<float>(k * 1000 + i) * 0.25f;
    if (arenas == 5) c.opt[2].clear();  // an empty arena in the middle keeps its place
    const std::string path = (d / ("a" + std::to_string(arenas) + ".ckpt")).string();
    save_checkpoint(path, c);
    const Checkpoint r = load_checkpoint(path);
    CHECK(r.opt == c.opt);
  }
}

TEST_CASE("checkpoint round trip is bit-identical", "[train][checkpoint]") {
  const fs::path d = temp_dir("ckpt");
  const Checkpoint c = sample_checkpoint();
  const std::string path = (d / "last.ckpt").string();
  save_checkpoint(path, c);
  const Checkpoint r = load_checkpoint(path);
  CHECK(std::memcmp(r.master.data(), c.master.data(), c.master.size() * 4) == 0);
  CHECK(r.opt == c.opt);
  CHECK(r.state == c.state);
  CHECK(r.header.config_name == "unit");
  CHECK(r.header.policy == "mixed_float16");
  CHECK(r.header.num_params == 1000);
  CHECK(r.header.epoch == 3);
  CHECK(r.header.step_in_epoch == 5);
  CHECK(r.header.global_step == 65);
  CHECK(r.header.applied_updates == 60);
  CHECK(r.header.scaler.scale == std::ldexp(1.0, 14));
  CHECK(r.header.scaler.good_steps == 17);
  CHECK(r.header.scaler.skipped_total == 5);
  CHECK(r.header.scaler.last_skip_reason == SkipReason::BackwardOverflow);
  CHECK(std::isinf(r.header.schedule.best));
  CHECK(r.header.schedule.wait == 2);
  CHECK(r.header.best_test_accuracy == 0.875);
  CHECK(r.header.epoch_loss_sum == 12.5);
  CHECK(r.header.seed == 7);
  // no temporary file is left behind
  int files = 0;
  for (auto& e : fs::directory_iterator(d)) { (void)e; ++files; }
  CHECK(files == 1);
  // the magic is at the start
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  in.read(magic, 8);
  CHECK(std::string(magic, 7) == "MPXCKPT");
  CHECK(magic[7] == '\0');
  fs::remove_all(d);
}

TEST_CASE("a corrupted checkpoint byte is an exit-3 error naming the file and offset", "[train][checkpoint]") {
  const fs::path d = temp_dir("ckpt_corrupt");
  const std::string path = (d / "last.ckpt").string();
  save_checkpoint(path, sample_checkpoint());
  const auto size = fs::file_size(path);
  for (uint64_t where : {uint64_t{3}, uint64_t{40}, size - 100, size / 2}) {
    save_checkpoint(path, sample_checkpoint());
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(where));
      char b = 0;
      f.get(b);
      f.seekp(static_cast<std::streamoff>(where));
      f.put(static_cast<char>(b ^ 0x10));
    }
    INFO("flipped byte " << where);
    try {
      load_checkpoint(path);
      FAIL("no error");
    } catch (const DataError& e) {
      const std::string msg = e.what();
      CHECK(e.exit_code() == 3);
      CHECK(msg.find(path) != std::string::npos);
      CHECK(msg.find("offset") != std::string::npos);
    }
  }
  fs::remove_all(d);
}

TEST_CASE("a truncated checkpoint is an exit-3 error", "[train][checkpoint]") {
  const fs::path d = temp_dir("ckpt_trunc");
  const std::string path = (d / "last.ckpt").string();
  save_checkpoint(path, sample_checkpoint());
  const auto size = fs::file_size(path);
  for (uint64_t keep : {size - 1, size / 2, uint64_t{30}, uint64_t{10}, uint64_t{0}}) {
    save_checkpoint(path, sample_checkpoint());
    fs::resize_file(path, keep);
    INFO("kept " << keep << " bytes");
    try {
      load_checkpoint(path);
      FAIL("no error");
    } catch (const DataError& e) {
      const std::string msg = e.what();
      CHECK(msg.find(path) != std::string::npos);
      CHECK(msg.find("truncated") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(load_checkpoint((d / "missing.ckpt").string()), DataError);
  fs::remove_all(d);
}

TEST_CASE("resolve_checkpoint_path", "[train][checkpoint]") {
  const fs::path d = temp_dir("ckpt_resolve");
  fs::create_directories(d / "checkpoints");
  CHECK_THROWS_AS(resolve_checkpoint_path(d.string()), ConfigError);
  CHECK_THROWS_AS(resolve_checkpoint_path((d / "nope").string()), ConfigError);
  save_checkpoint((d / "checkpoints" / "last.ckpt").string(), sample_checkpoint());
  CHECK(resolve_checkpoint_path(d.string()) == (d / "checkpoints" / "last.ckpt").string());
  CHECK(resolve_checkpoint_path((d / "checkpoints").string()) == (d / "checkpoints" / "last.ckpt").string());
  CHECK(resolve_checkpoint_path((d / "checkpoints" / "last.ckpt").string()) ==
        (d / "checkpoints" / "last.ckpt").string());
  fs::remove_all(d);
}

// ---- metrics and summary ----------------------------------------------------

TEST_CASE("metrics.jsonl lines parse; non-finite numbers become null", "[train][metrics]") {
  const fs::path d = temp_dir("metrics");
  const std::string path = (d / "metrics.jsonl").string();
  {
    MetricsWriter w(path, false);
    w.write({{"kind", "step"}, {"step", 1}, {"loss", 0.5}});
    w.write({{"kind", "step"}, {"step", 2}, {"loss", std::nan("")}});
  }
  {
    MetricsWriter w(path, true);
    w.write({{"kind", "epoch"}, {"epoch", 1}, {"test_loss", std::numeric_limits<double>::infinity()}});
  }
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> recs;
  while (std::getline(in, line)) recs.push_back(nlohmann::json::parse(line));
  REQUIRE(recs.size() == 3);
  CHECK(recs[0]["loss"] == 0.5);
  CHECK(recs[1]["loss"].is_null());
  CHECK(recs[2]["kind"] == "epoch");
  CHECK(recs[2]["test_loss"].is_null());
  fs::remove_all(d);
}

TEST_CASE("summary.json holds every TrainResult field", "[train][metrics]") {
  const fs::path d = temp_dir("summary");
  TrainResult r;
  r.status = "diverged";
  r.exit_code = 4;
  r.message = "boom";
  r.final_train_loss = std::nan("");
  r.memory.master_bytes = 1234;
  r.optimizer_state_bytes = 2468;
  r.policy = "float32";
  write_summary((d / "summary.json").string(), r);
  std::ifstream in(d / "summary.json");
  const auto j = nlohmann::json::parse(in);
  for (const char* k : {"status", "exit_code", "message", "epochs", "steps", "final_test_accuracy",
                        "best_test_accuracy", "final_train_loss", "images_per_sec", "wall_seconds",
                        "skipped_steps", "final_loss_scale", "last_skip_reason", "peak_memory_bytes", "policy",
                        "device", "eval_policy", "memory"})
    CHECK(j.contains(k));
  for (const char* k : {"activation_bytes", "master_bytes", "compute_copy_bytes", "grad_bytes",
                        "optimizer_state_bytes", "state_bytes"})
    CHECK(j["memory"].contains(k));
  CHECK(j["status"] == "diverged");
  CHECK(j["exit_code"] == 4);
  CHECK(j["final_train_loss"].is_null());
  CHECK(j["memory"]["master_bytes"] == 1234);
  CHECK(j["memory"]["optimizer_state_bytes"] == 2468);
  fs::remove_all(d);
}

TEST_CASE("write_file_atomic replaces the file", "[train][metrics]") {
  const fs::path d = temp_dir("atomic");
  const std::string p = (d / "a.txt").string();
  write_file_atomic(p, std::string("one"));
  write_file_atomic(p, std::string("two"));
  std::ifstream in(p);
  std::string s;
  in >> s;
  CHECK(s == "two");
  CHECK_THROWS_AS(write_file_atomic((d / "no" / "such" / "x").string(), std::string("x")), Error);
  fs::remove_all(d);
}

TEST_CASE("divergence advice suggests only what would change something", "[train][scaler]") {
  const std::string dynamic = "loss_scale.mode: dynamic";
  // Already dynamic under mixed_float16: not suggested again; the other policies are.
  const std::string fp16_dyn = divergence_advice(Policy::MixedFloat16, LossScaleMode::Dynamic);
  CHECK(fp16_dyn.find(dynamic) == std::string::npos);
  CHECK(fp16_dyn.find("policy: mixed_bfloat16 or float32") != std::string::npos);
  CHECK(divergence_advice(Policy::MixedFloat16, LossScaleMode::Fixed).find(dynamic) != std::string::npos);
  // float32 and bfloat16 need no loss scaling: never suggested there.
  const std::string fp32 = divergence_advice(Policy::Float32, LossScaleMode::None);
  CHECK(fp32.find(dynamic) == std::string::npos);
  CHECK(fp32.find("policy:") == std::string::npos);
  CHECK(fp32.find("optimizer.learning_rate") != std::string::npos);
  const std::string bf16 = divergence_advice(Policy::MixedBFloat16, LossScaleMode::None);
  CHECK(bf16.find(dynamic) == std::string::npos);
  CHECK(bf16.find("policy: float32") != std::string::npos);
}

TEST_CASE("checkpoints keep the starting loss of the divergence check", "[train][checkpoint]") {
  const fs::path d = temp_dir("start_loss");
  Checkpoint c = sample_checkpoint();
  c.header.start_loss = 2.302585;
  save_checkpoint((d / "a.ckpt").string(), c);
  CHECK(load_checkpoint((d / "a.ckpt").string()).header.start_loss == 2.302585);
  fs::remove_all(d);
}
