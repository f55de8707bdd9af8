// SPDX-License-Identifier: MIT
// The optimizers as core/optimizer_kind.h declares them: every config name has its fused
// update and its arenas; AMSGrad (three state arenas: m, v, v_hat) against a float64
// reference loop written here, through Backend::optimizer_step, its device-state twin and
// Optimizer; its three arenas checkpointed, resumed bit for bit and refused by another
// optimizer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/step_state.h"
#include "config/config.h"
#include "core/error.h"
#include "core/half.h"
#include "core/optimizer_kind.h"
#include "core/rng.h"
#include "io/checkpoint.h"
#include "support/backend_check.h"
#include "support/log_capture.h"
#include "support/run_files.h"
#include "support/train_options.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace mpx;
namespace fs = std::filesystem;

namespace {

/// Keras Adam with amsgrad=True in float64, from m = v = v_hat = 0; L2 decay as Adam's.
struct AmsgradRef {
  double lr, b1, b2, eps, wd;
  std::vector<double> w, m, v, vh;
  void step(const std::vector<float>& g, int64_t t) {
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, static_cast<double>(t))) /
                        (1 - std::pow(b1, static_cast<double>(t)));
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i] + wd * w[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      vh[i] = std::max(vh[i], v[i]);
      w[i] -= lr_t * m[i] / (std::sqrt(vh[i]) + eps);
    }
  }
};

/// The gradients of step t: per element, large for a few steps then a tenth or a
/// hundredth of that (so v falls below its running maximum), or growing (v_hat follows v).
std::vector<float> gradients(Rng& rng, size_t n, int t) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const double u = rng.uniform(-1, 1);
    const int pattern = static_cast<int>(i % 3);
    const double scale = pattern == 0 ? (t <= 2 ? 1.0 : 0.1) : pattern == 1 ? (t == 1 ? 1.0 : 0.01) : 0.2 * t;
    g[i] = static_cast<float>(u * scale);
  }
  return g;
}

std::vector<float> rounded(const std::vector<float>& v, DType t) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

/// Each element within rel of its reference, or of 1% of the largest reference where it is
/// smaller than that (m and v sum terms of both signs: their small values cancel).
void near(const char* what, const std::vector<float>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  double top = 0;
  for (double x : want) top = std::max(top, std::fabs(x));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::max(std::fabs(want[i]), 0.01 * top))) {
      if (bad++ < 5) UNSCOPED_INFO(what << "[" << i << "] = " << got[i] << ", float64 reference " << want[i]);
    }
  CHECK(bad == 0);
}

Config parse(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  return parse_config(yaml, "test.yaml", sets);
}

std::string small_yaml(const std::string& optimizer) {
  return "name: unit\nseed: 7\ndevice: cpu\npolicy: mixed_float16\nloss_scale: {growth_interval: 5}\n"
         "data:\n  dataset: synthetic\n  batch_size: 32\n  synthetic_train: 256\n  synthetic_test: 64\n"
         "optimizer:\n  name: " +
         optimizer +
         "\n  learning_rate: 2.0e-3\n  beta2: 0.99\n  weight_decay: 1.0e-3\n"
         "train:\n  epochs: 1\n  log_every: 2\n"
         "model:\n  layers:\n"
         "    - {type: conv2d, filters: 8, kernel: 3, use_bias: false}\n"
         "    - {type: batch_norm}\n"
         "    - {type: activation, activation: relu}\n"
         "    - {type: max_pool, pool_size: 2}\n"
         "    - {type: flatten}\n"
         "    - {type: dropout, rate: 0.25}\n"
         "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n";
}

}  // namespace

TEST_CASE("every config optimizer has its fused update and arenas, in the config's order", "[train][optimizer]") {
  const std::vector<OptimizerName> names = enum_values<OptimizerName>();
  REQUIRE(names.size() == std::size(kOptimizers));
  for (size_t i = 0; i < names.size(); ++i) {
    INFO(enum_name(names[i]));
    const OptimizerInfo* k = find_optimizer(enum_name(names[i]));
    REQUIRE(k);
    CHECK(k == &kOptimizers[i]);
    CHECK(&optimizer_info(k->kind) == k);
    CHECK(k->num_arenas() >= 1);
    OptimizerConfig cfg;
    cfg.name = names[i];
    cfg.momentum = 0.5;
    CHECK(Optimizer::num_arenas(cfg) == k->num_arenas());
    CHECK(Optimizer::state_bytes_for(cfg, 10) == static_cast<size_t>(k->num_arenas()) * 10 * sizeof(float));
  }
  CHECK(find_optimizer("amsgrad")->num_arenas() == 3);
  CHECK(std::string(find_optimizer("amsgrad")->arenas[2]) == "v_hat");
  CHECK(find_optimizer("nadam") == nullptr);
}

TEST_CASE("AMSGrad on the CPU backend follows a float64 reference over 6 steps", "[train][optimizer]") {
  support::CpuDev d;
  Rng rng(2024);
  const size_t n = 3000;
  std::vector<float> w0;
  const Tensor w = d.rand(rng, DType::F32, Shape{static_cast<int64_t>(n)}, &w0);
  const Tensor g = d.make(DType::F32, Shape{static_cast<int64_t>(n)});
  std::vector<Tensor> st;
  for (int i = 0; i < 3; ++i) {
    st.push_back(d.make(DType::F32, Shape{static_cast<int64_t>(n)}));
    d.be->fill(st.back(), 0.0f);
  }
  const Tensor copy = d.make(DType::BF16, Shape{static_cast<int64_t>(n)});

  OptimizerStep s;
  s.kind = OptimizerKind::Amsgrad;
  s.lr = 0.01f;
  s.beta1 = 0.9f;
  s.beta2 = 0.9f;  // v forgets fast, so it falls below its running maximum
  s.epsilon = 1e-7f;
  s.weight_decay = 0.01f;
  AmsgradRef ref{s.lr, s.beta1, s.beta2, s.epsilon, s.weight_decay, {w0.begin(), w0.end()},
                 std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  AmsgradRef adam = ref;  // the same without the maximum, to see that v_hat matters
  adam.vh.assign(n, 0.0);
  std::vector<double> adam_w = adam.w, adam_m(n), adam_v(n);

  for (int t = 1; t <= 6; ++t) {
    const std::vector<float> gt = gradients(rng, n, t);
    d.put(g, gt);
    s.t = t;
    d.be->optimizer_step(s, w, g, st, copy);
    ref.step(gt, t);
    const double lr_t = 0.01 * std::sqrt(1 - std::pow(0.9, t)) / (1 - std::pow(0.9, t));
    for (size_t i = 0; i < n; ++i) {
      const double gi = gt[i] + 0.01 * adam_w[i];
      adam_m[i] = 0.9 * adam_m[i] + 0.1 * gi;
      adam_v[i] = 0.9 * adam_v[i] + 0.1 * gi * gi;
      adam_w[i] -= lr_t * adam_m[i] / (std::sqrt(adam_v[i]) + 1e-7);
    }
  }
  const std::vector<float> wf = d.get(w), mf = d.get(st[0]), vf = d.get(st[1]), vhf = d.get(st[2]);
  near("w", wf, ref.w, 1e-5);
  near("m", mf, ref.m, 1e-5);
  near("v", vf, ref.v, 1e-5);
  near("v_hat", vhf, ref.vh, 1e-5);
  support::check_exact("compute copy", d.get(copy), rounded(wf, DType::BF16));

  // v_hat is the running maximum of v (and, where the gradients shrank, a fifth above it or
  // more by now), and the weights differ from plain Adam's far beyond the tolerance above.
  size_t above = 0, differs = 0;
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(vhf[i] >= vf[i]);
    above += vhf[i] > 1.2f * vf[i];
    differs += std::fabs(ref.w[i] - adam_w[i]) > 1e-4;
  }
  CHECK(above > n / 2);
  CHECK(differs > n / 2);

  // The backend checks the arenas against the row: v_hat missing, or one more than Adam keeps.
  CHECK_THROWS_WITH(d.be->optimizer_step(s, w, g, {st[0], st[1]}, copy),
                    Catch::Contains("state3 (amsgrad v_hat) is required"));
  s.kind = OptimizerKind::Adam;
  CHECK_THROWS_WITH(d.be->optimizer_step(s, w, g, st, copy), Catch::Contains("but adam keeps 2 state arena"));
}

TEST_CASE("AMSGrad through Optimizer: three arenas; the device-state step gives the same bits",
          "[train][optimizer]") {
  auto be = create_backend("cpu");
  OptimizerConfig cfg;
  cfg.name = *parse_enum<OptimizerName>("amsgrad");
  cfg.beta2 = 0.95;
  const int64_t n = 777;
  Optimizer host(cfg, *be, n), dev(cfg, *be, n);
  REQUIRE(host.states().size() == 3);
  CHECK(host.state_bytes() == 3 * n * sizeof(float));

  Rng rng(5);
  std::vector<float> w0(static_cast<size_t>(n));
  for (float& x : w0) x = static_cast<float>(rng.uniform(-1, 1));
  Buffer bw = be->alloc(n * 4, "w"), bw2 = be->alloc(n * 4, "w2"), bg = be->alloc(n * 4, "g");
  Buffer bst = be->alloc(sizeof(StepState), "state"), blr = be->alloc(4, "lr");
  const Tensor w = bw.view(DType::F32, Shape{n}), w2 = bw2.view(DType::F32, Shape{n});
  const Tensor g = bg.view(DType::F32, Shape{n});
  be->upload(w, w0.data());
  be->upload(w2, w0.data());
  const Tensor st(bst.data(), DType::U8, Shape{static_cast<int64_t>(sizeof(StepState))});
  const Tensor lr(blr.data(), DType::F32, Shape{1});
  AmsgradRef ref{1e-3, 0.9, 0.95, 1e-7, 0.0, {w0.begin(), w0.end()}, std::vector<double>(n),
                 std::vector<double>(n), std::vector<double>(n)};
  for (int t = 1; t <= 4; ++t) {
    const std::vector<float> gt = gradients(rng, static_cast<size_t>(n), t);
    be->upload(g, gt.data());
    host.step(w, g, Tensor(), 1e-3);
    ref.step(gt, t);
    StepState s;
    s.applied_total = t - 1;
    s.finite = 1;
    be->upload(st, &s);
    const float lr1 = 1e-3f;
    be->upload(lr, &lr1);
    dev.step_on_device(w2, g, Tensor(), st, lr);
    // A step whose verdict is non-finite leaves everything as it was.
    s.finite = 0;
    be->upload(st, &s);
    dev.step_on_device(w2, g, Tensor(), st, lr);
  }
  CHECK(host.iterations() == 4);
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  be->download(a.data(), w);
  be->download(b.data(), w2);
  CHECK(support::same_bits(a, b));
  near("w", a, ref.w, 1e-5);
  const auto hs = host.download_states(), ds = dev.download_states();
  REQUIRE(hs.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(support::same_bits(hs[i], ds[i]));
  near("v_hat", hs[2], ref.vh, 1e-5);

  // upload_states takes three arenas back, and refuses two.
  Optimizer back(cfg, *be, n);
  back.upload_states(hs);
  CHECK(support::same_bits(back.download_states()[2], hs[2]));
  CHECK_THROWS_AS(back.upload_states({hs[0], hs[1]}), ConfigError);
}

TEST_CASE("AMSGrad resume is bit-exact with its three arenas; an adam run refuses them",
          "[train][optimizer][checkpoint]") {
  const fs::path d = support::temp_dir("mpx_test_train_optimizer", "amsgrad");
  const Config two = parse(small_yaml("amsgrad"), {"train.epochs=2"});
  const Config one = parse(small_yaml("amsgrad"), {"train.epochs=1"});
  const TrainResult a = train(two, support::options(d / "straight"));
  REQUIRE(a.status == "completed");
  REQUIRE(train(one, support::options(d / "split")).status == "completed");
  const TrainResult b = train(two, support::options(d / "split", (d / "split").string()));
  REQUIRE(b.status == "completed");
  CHECK(b.steps == a.steps);

  const Checkpoint ka = load_checkpoint((d / "straight" / "checkpoints" / "last.ckpt").string());
  const Checkpoint kb = load_checkpoint((d / "split" / "checkpoints" / "last.ckpt").string());
  CHECK(ka.header.optimizer == "amsgrad");
  REQUIRE(ka.opt.size() == 3);
  REQUIRE(kb.opt.size() == 3);
  CHECK(support::same_bits(ka.master, kb.master));
  CHECK(support::same_bits(ka.state, kb.state));
  for (size_t i = 0; i < 3; ++i) CHECK(support::same_bits(ka.opt[i], kb.opt[i]));
  CHECK(ka.header.applied_updates == kb.header.applied_updates);
  CHECK(ka.header.scaler.scale == kb.header.scaler.scale);
  CHECK(b.final_train_loss == a.final_train_loss);
  // The third arena is v's running maximum: never below v, above it somewhere.
  size_t above = 0;
  for (size_t i = 0; i < ka.opt[1].size(); ++i) {
    REQUIRE(ka.opt[2][i] >= ka.opt[1][i]);
    above += ka.opt[2][i] > ka.opt[1][i];
  }
  CHECK(above > 0);

  // Adam keeps two arenas: resuming the AMSGrad run with it is a configuration error (exit 2).
  const Config adam = parse(small_yaml("adam"), {"train.epochs=2"});
  TrainResult r;
  {
    support::ExpectLogs logs;  // the refusal is logged as an error
    r = train(adam, support::options(d / "adam", (d / "straight").string()));
  }
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 2);
  fs::remove_all(d);
}
