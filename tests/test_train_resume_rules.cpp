// SPDX-License-Identifier: MIT
// What --resume accepts (train_state.h): the same architecture, data set and
// optimizer, else a ConfigError naming what differs (a model of the same size
// but other shapes included); a changed seed only warns. And what a checkpoint
// reader accepts: a CRC-valid header with impossible values is corrupt.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "config/config.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "support/log_capture.h"
#include "support/run_files.h"
#include "support/train_options.h"
#include "train/trainer.h"

using namespace mpx;
using support::options;
namespace fs = std::filesystem;

namespace {

std::string yaml(const std::string& kernel) {
  return "name: rules\nseed: 4\ndevice: cpu\n"
         "data: {dataset: synthetic, batch_size: 16, synthetic_train: 32, synthetic_test: 16}\n"
         "train: {epochs: 1}\n"
         "model:\n  layers:\n"
         "    - {type: conv2d, filters: 4, kernel: " + kernel + ", use_bias: false, name: c}\n"
         "    - {type: flatten}\n"
         "    - {type: dense, units: 10, activation: softmax, name: out}\n";
}


}  // namespace

TEST_CASE("resume refuses another architecture of the same size, another data set; warns on a new seed",
          "[train][checkpoint][resume]") {
  const fs::path d = support::temp_dir("mpx_test_resume_rules", "arch");
  support::ExpectLogs log;  // the refused resumes log their errors
  // kernel [3, 1] and [1, 3] on 28x28: the dense layer sees 26*28 vs 28*26 inputs, the same count.
  REQUIRE(train(parse_config(yaml("[3, 1]"), "a.yaml"), options(d / "a")).status == "completed");
  const Config other = parse_config(yaml("[1, 3]"), "b.yaml", {"train.epochs=2"});
  const TrainResult r = train(other, options(d / "b", (d / "a").string()));
  CHECK(r.exit_code == 2);
  CHECK(r.message.find("written for another model") != std::string::npos);
  CHECK(r.message.find("c/kernel [4, 3, 1, 1]") != std::string::npos);
  CHECK(r.message.find("c/kernel [4, 1, 3, 1]") != std::string::npos);

  const Config mnist = parse_config(yaml("[3, 1]"), "c.yaml",
                                    {"train.epochs=2", "data.dataset=mnist",
                                     "data.path=" + std::string(MPX_SHARED_DATA) + "/mnist", "data.train_limit=32",
                                     "data.test_limit=16"});
  const TrainResult r2 = train(mnist, options(d / "c", (d / "a").string()));
  CHECK(r2.exit_code == 2);
  CHECK(r2.message.find("was trained on data set 'synthetic', the config reads 'mnist'") != std::string::npos);

  const Config seed = parse_config(yaml("[3, 1]"), "s.yaml", {"train.epochs=2", "seed=5"});
  const TrainResult r3 = train(seed, options(d / "s", (d / "a").string()));
  CHECK(r3.status == "completed");
  CHECK(log.contains("with seed 4, the config has 5"));
}

TEST_CASE("a CRC-valid checkpoint header with impossible values is corrupt", "[train][checkpoint]") {
  const fs::path d = support::temp_dir("mpx_test_resume_rules", "header");
  REQUIRE(train(parse_config(yaml("3"), "a.yaml"), options(d / "a")).status == "completed");
  const std::string path = (d / "a" / "checkpoints" / "last.ckpt").string();
  const Checkpoint good = load_checkpoint(path);
  for (int k = 0; k < 3; ++k) {
    Checkpoint c = good;
    if (k == 0) c.header.epoch = -1;
    if (k == 1) c.header.scaler.scale = -2.0;
    if (k == 2) c.header.applied_updates = c.header.global_step + 1;
    const std::string bad = (d / ("bad" + std::to_string(k) + ".ckpt")).string();
    save_checkpoint(bad, c);
    try {
      (void)load_checkpoint(bad);
      FAIL("accepted case " << k);
    } catch (const DataError& e) {
      CHECK(std::string(e.what()).find("corrupt at byte offset 16: the header holds") != std::string::npos);
    }
  }
}
