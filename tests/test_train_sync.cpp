// SPDX-License-Identifier: MIT
// train.sync: log (the step without host synchronisation: loss scale, verdicts, Adam's t
// and the metrics of the log window in a device StepState, read every log_every steps,
// inputs through the double-buffered staged upload) against train.sync: step (the host
// reads the loss and the verdict every step), on the CPU backend, where both run the
// same kernels: the runs must agree bit for bit, in weights, optimizer and scaler state,
// and in every metrics record; and the failures the host path reports per step
// (a non-finite float32 loss, too many skips in a row) are still reported.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands/bench.h"
#include "config/config.h"
#include "io/checkpoint.h"
#include "support/log_capture.h"
#include "support/run_files.h"
#include "support/train_options.h"
#include "train/trainer.h"

using namespace mpx;
using support::options;
namespace fs = std::filesystem;
using nlohmann::json;
using support::read_jsonl;
using support::read_text;
using support::same_bits;

namespace {

fs::path temp_dir(const std::string& name) { return support::temp_dir("mpx_test_sync", name); }

// Synthetic data, 8 steps of 32 per epoch; batch norm (state arena), dropout, Adam, mixed_float16
// with dynamic scaling from 2^30 (the first steps overflow and back off) and growth every 3 steps.
const char* kYaml = R"(name: sync
seed: 11
device: cpu
policy: mixed_float16
loss_scale: {mode: dynamic, initial: 1073741824, growth_interval: 3}
data: {dataset: synthetic, batch_size: 32, synthetic_train: 256, synthetic_test: 128}
optimizer: {name: adam, learning_rate: 2.0e-3}
train: {epochs: 2, log_every: 3}
model:
  layers:
    - {type: conv2d, filters: 4, kernel: 3, use_bias: false}
    - {type: batch_norm}
    - {type: activation, activation: relu}
    - {type: max_pool, pool_size: 2}
    - {type: flatten}
    - {type: dropout, rate: 0.25}
    - {type: dense, units: 10, activation: softmax, dtype: float32}
)";





void check_same_checkpoint(const Checkpoint& a, const Checkpoint& b) {
  CHECK(same_bits(a.master, b.master));
  CHECK(same_bits(a.state, b.state));
  REQUIRE(a.opt.size() == b.opt.size());
  for (size_t i = 0; i < a.opt.size(); ++i) CHECK(same_bits(a.opt[i], b.opt[i]));
  CHECK(a.header.applied_updates == b.header.applied_updates);
  CHECK(a.header.global_step == b.header.global_step);
  CHECK(a.header.scaler.scale == b.header.scaler.scale);
  CHECK(a.header.scaler.good_steps == b.header.scaler.good_steps);
  CHECK(a.header.scaler.skipped_total == b.header.scaler.skipped_total);
  CHECK(a.header.scaler.consecutive_skips == b.header.scaler.consecutive_skips);
  CHECK(a.header.scaler.last_skip_reason == b.header.scaler.last_skip_reason);
}

}  // namespace

TEST_CASE("train.sync log equals train.sync step bit for bit on the CPU", "[train][sync]") {
  const fs::path d = temp_dir("equal");
  const Config step_cfg = parse_config(kYaml, "sync.yaml", {"train.sync=step"});
  const Config log_cfg = parse_config(kYaml, "sync.yaml", {"train.sync=log"});

  const TrainResult a = train(step_cfg, options(d / "step"));
  const TrainResult b = train(log_cfg, options(d / "log"));
  REQUIRE(a.status == "completed");
  REQUIRE(b.status == "completed");
  // The scenario exercises the scaler: overflow skips at the start, growth later.
  CHECK(a.skipped_steps >= 3);
  CHECK(a.final_loss_scale > 1.0);

  CHECK(b.steps == a.steps);
  CHECK(b.skipped_steps == a.skipped_steps);
  CHECK(b.final_loss_scale == a.final_loss_scale);
  CHECK(b.last_skip_reason == a.last_skip_reason);
  CHECK(b.final_train_loss == a.final_train_loss);
  CHECK(b.final_train_accuracy == a.final_train_accuracy);
  CHECK(b.final_test_accuracy == a.final_test_accuracy);
  CHECK(b.final_test_loss == a.final_test_loss);

  for (const char* ck : {"last.ckpt", "best.ckpt"}) {
    INFO(ck);
    check_same_checkpoint(load_checkpoint((d / "step" / "checkpoints" / ck).string()),
                          load_checkpoint((d / "log" / "checkpoints" / ck).string()));
  }

  // Every metrics record agrees (timings aside): the windows of log_every = 3 steps cross the
  // epoch boundary (8 steps per epoch), so the read at the end of an epoch is covered.
  const auto ra = read_jsonl(d / "step" / "metrics.jsonl");
  const auto rb = read_jsonl(d / "log" / "metrics.jsonl");
  REQUIRE(ra.size() == rb.size());
  int steps = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    INFO("record " << i << ": " << ra[i].dump() << " vs " << rb[i].dump());
    CHECK(ra[i]["kind"] == rb[i]["kind"]);
    CHECK(ra[i]["step"] == rb[i]["step"]);
    for (const char* k : {"loss", "accuracy", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                          "loss_scale", "skipped_steps", "epoch_skipped_steps", "last_skip_reason", "learning_rate"})
      if (ra[i].contains(k)) CHECK(ra[i][k] == rb[i][k]);
    steps += ra[i]["kind"] == "step";
  }
  CHECK(steps == 5);  // steps 3, 6, 9, 12, 15 of 16

  // The log says how the step synchronises.
  CHECK(read_text(d / "log" / "train.log").find("stay on the device and are read every 3 steps") !=
        std::string::npos);
  CHECK(read_text(d / "step" / "train.log").find("reads its loss and verdict back every step") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("train.sync log: interrupted and resumed equals straight through", "[train][sync][checkpoint]") {
  const fs::path d = temp_dir("resume");
  const Config cfg = parse_config(kYaml, "sync.yaml", {"train.sync=log"});
  const TrainResult a = train(cfg, options(d / "straight"));
  REQUIRE(a.status == "completed");

  stop_requested() = true;  // SIGINT during the first step: the pending step is read back before saving
  const TrainResult c1 = train(cfg, options(d / "intr"));
  stop_requested() = false;
  CHECK(c1.status == "interrupted");
  CHECK(c1.steps == 1);
  const Checkpoint mid = load_checkpoint((d / "intr" / "checkpoints" / "last.ckpt").string());
  CHECK(mid.header.global_step == 1);
  CHECK(mid.header.scaler.skipped_total == 1);  // 2^30 overflows: the device verdict reached the checkpoint
  CHECK(mid.header.scaler.scale == 536870912.0);
  const TrainResult c2 = train(cfg, options(d / "intr", (d / "intr").string()));
  REQUIRE(c2.status == "completed");
  check_same_checkpoint(load_checkpoint((d / "straight" / "checkpoints" / "last.ckpt").string()),
                        load_checkpoint((d / "intr" / "checkpoints" / "last.ckpt").string()));
  CHECK(c2.final_train_loss == a.final_train_loss);
  fs::remove_all(d);
}

TEST_CASE("train.sync log reports a non-finite float32 loss as diverged, exit 4", "[train][sync][diverge]") {
  const fs::path d = temp_dir("diverge");
  // No batch norm: the activations grow with the weights until the loss overflows.
  const char* yaml = R"(name: sync
seed: 7
device: cpu
policy: float32
data: {dataset: synthetic, batch_size: 32, synthetic_train: 256, synthetic_test: 128}
optimizer: {name: sgd, learning_rate: 1.0e10}
train: {epochs: 20, log_every: 4, sync: log, divergence_factor: 0}  # runs on to inf/NaN
model:
  layers:
    - {type: conv2d, filters: 4, kernel: 3, activation: relu}
    - {type: max_pool, pool_size: 2}
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax}
)";
  const Config cfg = parse_config(yaml, "diverge.yaml");
  TrainResult r;
  {
    support::ExpectLogs logs;
    r = train(cfg, options(d / "run"));
    CHECK(logs.contains("diverged"));
  }
  CHECK(r.status == "diverged");
  CHECK(r.exit_code == 4);
  CHECK(r.message.find("non-finite") != std::string::npos);
  CHECK(r.message.find("train.sync") != std::string::npos);
  CHECK(r.steps > 0);
  CHECK(r.steps % 4 == 0);  // found at a read, every log_every steps (or at an epoch's end: 8 steps)
  CHECK(nlohmann::json::parse(read_text(d / "run" / "summary.json"))["status"] == "diverged");
  fs::remove_all(d);
}

TEST_CASE("train.sync log: max_consecutive_skips ends the run as diverged", "[train][sync][diverge]") {
  const fs::path d = temp_dir("skips");
  // A fixed scale of 2^60 overflows float16 every step.
  const Config cfg =
      parse_config(kYaml, "sync.yaml",
                   {"train.sync=log", "loss_scale.mode=fixed", "loss_scale.initial=1.152921504606847e18",
                    "loss_scale.max_consecutive_skips=5", "train.log_every=2"});
  TrainResult r;
  {
    support::ExpectLogs logs;
    r = train(cfg, options(d / "run"));
  }
  CHECK(r.status == "diverged");
  CHECK(r.exit_code == 4);
  CHECK(r.message.find("consecutive steps were skipped") != std::string::npos);
  CHECK(r.skipped_steps >= 5);
  CHECK(r.steps == 6);  // the 5th skip happens at step 5 and is read at step 6
  fs::remove_all(d);
}

TEST_CASE("train.sync log falls back to step where it cannot work, and says why", "[train][sync]") {
  const fs::path d = temp_dir("fallback");
  const Config cfg = parse_config(kYaml, "sync.yaml",
                                  {"train.sync=log", "debug.check_numerics=true", "train.max_steps=2"});
  support::ExpectLogs logs;
  const TrainResult r = train(cfg, options(d / "run"));
  CHECK(r.status == "completed");
  CHECK(logs.contains("train.sync: log is not possible here"));
  CHECK(logs.contains("check_numerics"));
  fs::remove_all(d);
}

TEST_CASE("train.sync and train.cuda_graph are validated and round-trip", "[train][sync][config]") {
  CHECK_THROWS_WITH(parse_config(kYaml, "sync.yaml", {"train.sync=sometimes"}),
                    Catch::Contains("train.sync") && Catch::Contains("step"));
  const Config c = parse_config(kYaml, "sync.yaml", {"train.sync=log", "train.cuda_graph=false"});
  const Config back = parse_config(to_yaml(c), "back.yaml");
  CHECK(back.train.sync == SyncMode::Log);
  CHECK(back.train.cuda_graph == false);
  CHECK(parse_config(kYaml, "sync.yaml").train.sync == SyncMode::Auto);
  CHECK(parse_config(kYaml, "sync.yaml").train.cuda_graph == false);
}

TEST_CASE("mpx bench under train.sync log also times the steps as one block", "[train][sync][bench]") {
  const BenchResult log = bench(parse_config(kYaml, "sync.yaml", {"train.sync=log"}), 3, 1);
  CHECK(log.images_per_sec > 0);
  CHECK(log.images_per_sec_pipelined > 0);
  const BenchResult step = bench(parse_config(kYaml, "sync.yaml", {"train.sync=step"}), 3, 1);
  CHECK(step.images_per_sec > 0);
  CHECK(step.images_per_sec_pipelined == 0);
}
