// SPDX-License-Identifier: MIT
// A stop (SIGINT/SIGTERM) that arrives after an epoch's last step: the epoch is
// finished first (evaluation, its metrics record, the best checkpoint and
// reduce_on_plateau's step), then last.ckpt is saved, so the resumed run ends
// bit for bit where an uninterrupted one does, with one record per epoch.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "config/config.h"
#include "io/checkpoint.h"
#include "support/run_files.h"
#include "support/train_options.h"
#include "train/trainer.h"

using namespace mpx;
using support::options;
namespace fs = std::filesystem;
using support::read_json;
using support::read_jsonl;
using support::same_bits;

namespace {

// One step per epoch (16 records, batch 16); the plateau schedule with patience 0 cuts the rate
// after every evaluation whose test loss did not improve, so a lost evaluation changes the weights.
const char* kYaml = R"(name: intr
seed: 3
device: cpu
data: {dataset: synthetic, batch_size: 16, synthetic_train: 16, synthetic_test: 32}
optimizer: {name: sgd, learning_rate: 0.5, momentum: 0.9}
schedule: {name: reduce_on_plateau, patience: 0, factor: 0.5, min_delta: 0.0}
train: {epochs: 6, log_every: 1}
model:
  layers:
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax}
)";


}  // namespace

TEST_CASE("a stop after an epoch's last step keeps that epoch's evaluation and plateau step", "[train][interrupt]") {
  const fs::path d = support::temp_dir("mpx_test_interrupt", "boundary");
  const Config cfg = parse_config(kYaml, "intr.yaml");
  const TrainResult a = train(cfg, options(d / "straight"));
  REQUIRE(a.status == "completed");

  // Interrupt after step 1, 2 and 3 in turn (each at an epoch boundary), resuming in between.
  for (int k = 0; k < 3; ++k) {
    stop_requested() = true;
    const TrainResult r =
        train(cfg, options(d / "cut", k == 0 ? std::string() : (d / "cut").string()));
    stop_requested() = false;
    REQUIRE(r.status == "interrupted");
    CHECK(r.steps == k + 1);
    CHECK(r.epochs == k + 1);  // the epoch counts as done
  }
  const TrainResult b = train(cfg, options(d / "cut", (d / "cut").string()));
  REQUIRE(b.status == "completed");

  const Checkpoint ka = load_checkpoint((d / "straight" / "checkpoints" / "last.ckpt").string());
  const Checkpoint kb = load_checkpoint((d / "cut" / "checkpoints" / "last.ckpt").string());
  CHECK(same_bits(ka.master, kb.master));
  CHECK(ka.header.schedule.plateau_lr == kb.header.schedule.plateau_lr);
  CHECK(ka.header.best_test_accuracy == kb.header.best_test_accuracy);
  CHECK(b.final_test_accuracy == a.final_test_accuracy);
  CHECK(b.final_test_loss == a.final_test_loss);

  // One epoch record per epoch, each with its evaluation, equal to the uninterrupted run's.
  auto epochs = [](const fs::path& run) {
    std::vector<nlohmann::json> e;
    for (const auto& j : read_jsonl(run / "metrics.jsonl"))
      if (j["kind"] == "epoch") e.push_back(j);
    return e;
  };
  const auto ea = epochs(d / "straight"), eb = epochs(d / "cut");
  REQUIRE(ea.size() == 6);
  REQUIRE(eb.size() == 6);
  for (size_t i = 0; i < ea.size(); ++i) {
    INFO("epoch " << i + 1);
    CHECK(eb[i]["epoch"] == ea[i]["epoch"]);
    CHECK(eb[i]["test_loss"] == ea[i]["test_loss"]);
    CHECK(eb[i]["learning_rate"] == ea[i]["learning_rate"]);
  }
}
