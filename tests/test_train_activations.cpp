// SPDX-License-Identifier: MIT
// A short training with each activation end to end on the CPU backend (the synthetic data
// set, a conv + dense net whose hidden layers all use the activation, fused and as its own
// layer): it completes, the training loss goes down, and the resolved config.yaml keeps the
// activation (and leaky_relu's slope). float32 and mixed_bfloat16 (and mixed_float16 with
// its dynamic loss scale for GELU, the activation whose negative side saturates to zero).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "support/run_files.h"
#include "train/trainer.h"

using namespace mpx;
namespace fs = std::filesystem;

namespace {

std::string yaml(const std::string& policy, const std::string& act) {
  return "name: act\nseed: 11\ndevice: cpu\npolicy: " + policy +
         "\n"
         "data: {dataset: synthetic, batch_size: 32, synthetic_train: 384, synthetic_test: 64}\n"
         "optimizer: {name: adam, learning_rate: 3.0e-3}\n"
         "train: {epochs: 2, log_every: 4}\n"
         "model:\n  layers:\n"
         "    - {type: conv2d, filters: 8, kernel: 3, " + act + "}\n"
         "    - {type: max_pool, pool_size: 2}\n"
         "    - {type: conv2d, filters: 8, kernel: 3}\n"
         "    - {type: activation, " + act + "}\n"
         "    - {type: max_pool, pool_size: 2}\n"
         "    - {type: flatten}\n"
         "    - {type: dense, units: 32, " + act + "}\n"
         "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n";
}

}  // namespace

TEST_CASE("training with each activation: the loss goes down", "[train][activation]") {
  struct Case {
    std::string act, policy;
  };
  const std::vector<Case> cases = {
      {"activation: relu", "float32"},
      {"activation: gelu", "float32"},          {"activation: gelu", "mixed_float16"},
      {"activation: gelu_tanh", "float32"},     {"activation: silu", "mixed_bfloat16"},
      {"activation: swish", "float32"},         {"activation: leaky_relu", "float32"},
      {"activation: leaky_relu, negative_slope: 0.05", "mixed_bfloat16"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.act << " " << c.policy) {
      const fs::path d = support::temp_dir("mpx_test_train_act", c.policy);
      const Config cfg = parse_config(yaml(c.policy, c.act), "act.yaml");
      TrainOptions o;
      o.run_dir = (d / "run").string();
      o.progress = false;
      const TrainResult r = train(cfg, o);
      INFO(r.message);
      REQUIRE(r.status == "completed");
      CHECK(r.steps == 24);
      CHECK(r.skipped_steps <= 2);  // mixed_float16: the dynamic scale may back off at the start
      // The loss of the first logged window against the last one.
      const auto lines = support::read_jsonl(d / "run" / "metrics.jsonl");
      double first = -1, last = -1;
      for (const auto& j : lines) {
        if (j.value("kind", "") != "step" || !j["loss"].is_number()) continue;
        if (first < 0) first = j["loss"].get<double>();
        last = j["loss"].get<double>();
      }
      INFO("first window loss " << first << ", last " << last << ", final " << r.final_train_loss);
      REQUIRE(first > 0);
      CHECK(last < 0.7 * first);
      CHECK(std::isfinite(r.final_train_loss));
      // The run's resolved config keeps the activation.
      const std::string resolved = support::read_text(d / "run" / "config.yaml");
      const std::string name = c.act.substr(12, c.act.find(',') == std::string::npos ? std::string::npos
                                                                                     : c.act.find(',') - 12);
      CHECK(resolved.find("activation: " + name) != std::string::npos);
      if (c.act.find("negative_slope") != std::string::npos)
        CHECK(resolved.find("negative_slope: 0.05") != std::string::npos);
      fs::remove_all(d);
    }
  }
}
