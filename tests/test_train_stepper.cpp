// SPDX-License-Identifier: MIT
// The two steppers of the Engine (train/stepper.h), driven directly, without
// train(): on the CPU backend the device-state step (train.sync log) runs the same
// kernels as the host step, so over the same batches both must leave the same
// weights, optimizer state and loss-scaler state bit for bit, and report the same
// sums; skipped steps (an initial loss scale that overflows float16) included.
// Also: the Session set-up that every command shares.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "support/run_files.h"
#include "train/session.h"
#include "train/stepper.h"

using namespace mpx;
using support::same_bits;

namespace {

const char* kYaml = R"(name: stepper
seed: 5
device: cpu
policy: mixed_float16
loss_scale: {mode: dynamic, initial: 1073741824, growth_interval: 2}
data: {dataset: synthetic, batch_size: 16, synthetic_train: 64, synthetic_test: 32}
optimizer: {name: adam, learning_rate: 3.0e-3}
train: {log_every: 4}
model:
  layers:
    - {type: conv2d, filters: 4, kernel: 3, use_bias: false}
    - {type: batch_norm}
    - {type: activation, activation: relu}
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax, dtype: float32}
)";

struct Outcome {
  std::vector<float> master, state, m, v;
  LossScalerState scaler;
  int64_t iterations = 0, counted = 0, skipped = 0;
  double loss_sum = 0, correct = 0;
  std::string description;
};

std::vector<float> host(Backend& be, const Tensor& t) {
  std::vector<float> v(t.empty() ? 0 : static_cast<size_t>(t.numel()));
  if (!v.empty()) be.download(v.data(), t);
  return v;
}

Outcome run(const std::string& sync, int steps) {
  const Config cfg = parse_config(kYaml, "stepper.yaml", {"train.sync=" + sync});
  Session s(cfg);
  s.start_backend();
  s.load_data(DataNeed::TrainAndTest);
  std::unique_ptr<Model> model = s.make_model(cfg.data.batch_size);
  model->init_params(cfg.seed);
  Engine e(s.config(), s.policy(), s.backend(), std::move(model), s.loss_scale_mode());
  Outcome o;
  o.description = e.stepper().description();
  const Dataset& ds = s.train_data();
  const int64_t B = cfg.data.batch_size;
  auto add = [&](const StepOutcome& r) {
    o.counted += r.counted, o.skipped += r.skipped, o.loss_sum += r.loss_sum, o.correct += r.correct;
  };
  for (int i = 0; i < steps; ++i) {
    const int64_t first = (i * B) % ds.size();
    const StepOutcome r = e.step(ds.images.data() + first * ds.image_bytes(), ds.labels.data() + first, B, B, 3e-3, i);
    if (r.pending) {
      if ((i + 1) % 4 == 0) add(e.flush());
    } else {
      add(r);
    }
  }
  if (e.pending()) add(e.flush());
  Backend& be = s.backend();
  o.master = host(be, e.model().master());
  o.state = host(be, e.model().state());
  o.m = host(be, e.optimizer().state1());
  o.v = host(be, e.optimizer().state2());
  o.scaler = e.scaler().state();
  o.iterations = e.optimizer().iterations();
  return o;
}

}  // namespace

TEST_CASE("stepper: the device-state step equals the host step bit for bit on the CPU", "[train][stepper]") {
  const Outcome a = run("step", 10), b = run("log", 10);
  CHECK(a.description.find("every step") != std::string::npos);
  CHECK(b.description.find("stay on the device") != std::string::npos);
  REQUIRE(a.master.size() == b.master.size());
  CHECK(same_bits(a.master, b.master));
  CHECK(same_bits(a.state, b.state));
  CHECK(same_bits(a.m, b.m));
  CHECK(same_bits(a.v, b.v));
  CHECK(a.scaler.scale == b.scaler.scale);
  CHECK(a.scaler.good_steps == b.scaler.good_steps);
  CHECK(a.scaler.skipped_total == b.scaler.skipped_total);
  CHECK(a.iterations == b.iterations);
  CHECK(a.counted == b.counted);
  CHECK(a.skipped == b.skipped);
  CHECK(a.loss_sum == b.loss_sum);
  CHECK(a.correct == b.correct);
  // 2^30 overflows float16 gradients: the first steps are skipped, then training proceeds.
  CHECK(a.skipped > 0);
  CHECK(a.skipped == a.scaler.skipped_total);
  CHECK(a.iterations == 10);  // skipped steps count too (Keras 2 optimizer.iterations)
  CHECK(a.scaler.scale < 1073741824.0);
}

TEST_CASE("session: the shared set-up resolves, reads, builds and initialises", "[train][session]") {
  const Config cfg = parse_config(kYaml, "stepper.yaml", {"policy=auto", "model.input_shape=[28, 28, 1]"});
  Session s(cfg);
  CHECK(s.device().device == "cpu");
  s.start_backend();
  CHECK(s.config().policy != Policy::Auto);
  CHECK(s.config().loss_scale.mode_explicit);
  CHECK(!s.policy_reason().empty());
  s.load_data(DataNeed::TrainAndTest);
  CHECK(s.train_data().size() == 64);
  CHECK(s.test_data().size() == 32);
  CHECK(s.input_shape() == Shape{28, 28, 1});
  std::unique_ptr<Model> m = s.make_model(8);
  CHECK(s.init_weights(*m) == "initialization with seed 5");

  const Config bad = parse_config(kYaml, "stepper.yaml", {"model.input_shape=[32, 32, 3]"});
  Session b(bad);
  b.start_backend();
  try {
    b.load_data(DataNeed::Test);
    FAIL("no error for a wrong input_shape");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("model.input_shape [32, 32, 3] does not match the data set synthetic") !=
          std::string::npos);
  }
}
