// SPDX-License-Identifier: MIT
// The trainer end to end on the CPU backend: the optimizer step through the
// trainer, loss-scale overflow and underflow, bit-exact resume, checkpoint
// mismatch, divergence with its run directory, interruption, eval and bench;
// [e2e] (hidden from the default run of this executable: minutes on 2 CPU cores; CTest runs it
// as its own test, mnist_policies_e2e): one epoch of the smoke net on
// real MNIST under the three policies.
#include <catch2/catch.hpp>
#include <mpx/config.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/backend.h"
#include "commands/bench.h"
#include "commands/eval.h"
#include "config/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "io/checkpoint.h"
#include "nn/model.h"
#include "support/log_capture.h"
#include "support/run_files.h"
#include "support/skip.h"
#include "support/train_options.h"
#include "train/trainer.h"
#include "weights/weights.h"

using namespace mpx;
using support::options;
namespace fs = std::filesystem;
using nlohmann::json;
using support::read_json;
using support::read_jsonl;
using support::read_text;
using support::same_bits;

namespace {

fs::path temp_dir(const std::string& name) { return support::temp_dir("mpx_test_train", name); }

/// A small synthetic-data config; `extra` lines are appended at the top level.
std::string small_yaml(const std::string& policy, const std::string& optimizer, const std::string& extra = "",
                       const std::string& layers = "") {
  std::string s = "name: unit\nseed: 7\ndevice: cpu\npolicy: " + policy +
                  "\n"
                  "data:\n  dataset: synthetic\n  batch_size: 32\n  synthetic_train: 256\n  synthetic_test: 128\n"
                  "optimizer:\n" +
                  optimizer +
                  "train:\n  epochs: 1\n  log_every: 2\n"
                  "model:\n  layers:\n" +
                  (layers.empty() ? "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
                                    "    - {type: max_pool, pool_size: 2}\n"
                                    "    - {type: flatten}\n"
                                    "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n"
                                  : layers) +
                  extra;
  return s;
}

Config parse(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  return parse_config(yaml, "test.yaml", sets);
}






/// Gradients (unscaled, float32) of one batch under `policy` with loss multiplier `tiny` and loss scale S.
std::vector<float> gradients(Policy policy, double tiny, double S, const Config& cfg) {
  auto be = create_backend("cpu");
  const Dataset ds = load_dataset(cfg.data, Split::Train, cfg.seed);
  const int64_t n = 32;
  Model m(cfg, policy, *be, ds.H, ds.W, ds.C, 10, n);
  std::vector<double> mean, stdv;
  default_normalization(DatasetName::Synthetic, mean, stdv);
  m.set_input_normalization(mean, stdv);
  m.init_params(cfg.seed);
  Buffer xb = be->alloc(static_cast<size_t>(n * ds.image_bytes()), "x");
  Buffer yb = be->alloc(static_cast<size_t>(n) * 4, "y");
  Buffer sb = be->alloc(64, "scalars");
  Buffer db = be->alloc(static_cast<size_t>(n) * 10 * 4, "dlogits");
  const Tensor x = xb.view(DType::U8, Shape{n, ds.H, ds.W, ds.C}), y = yb.view(DType::I32, Shape{n});
  be->upload(x, ds.images.data());
  be->upload(y, ds.labels.data());
  const Tensor logits = m.forward(x, true);
  const Tensor loss(sb.data(), DType::F32, Shape{1}), correct(static_cast<char*>(sb.data()) + 4, DType::F32, Shape{1});
  const Tensor dl = db.view(DType::F32, Shape{n, 10});
  be->softmax_cross_entropy(logits, y, static_cast<float>(tiny * S), loss, correct, dl);
  m.backward(dl);
  const bool finite = be->unscale_and_check(m.grads(), static_cast<float>(1.0 / S));
  REQUIRE(finite);
  std::vector<float> g(static_cast<size_t>(m.num_params()));
  be->download(g.data(), m.grads());
  return g;
}

}  // namespace

// ---- device / policy resolution ---------------------------------------------

TEST_CASE("resolve_policy follows the docs/precision.md auto table", "[train][policy]") {
  DeviceInfo gpu;
  gpu.name = "cuda:0";
  std::string why;
  gpu.compute_capability = 90;
  CHECK(resolve_policy(Policy::Auto, gpu, &why) == Policy::MixedBFloat16);
  CHECK(why.find("9.0") != std::string::npos);
  gpu.compute_capability = 80;
  CHECK(resolve_policy(Policy::Auto, gpu, &why) == Policy::MixedBFloat16);
  gpu.compute_capability = 75;
  CHECK(resolve_policy(Policy::Auto, gpu, &why) == Policy::MixedFloat16);
  gpu.compute_capability = 61;
  CHECK(resolve_policy(Policy::Auto, gpu, &why) == Policy::Float32);
  CHECK(resolve_policy(Policy::MixedFloat16, gpu, &why) == Policy::MixedFloat16);

  // The CPU: the backend's own 16-bit path decides, whatever /proc/cpuinfo says.
  DeviceInfo cpu;
  cpu.name = "cpu";
  cpu.native_bf16 = true, cpu.math_bf16 = "native bf16 (avx512_core_amx)";
  CHECK(resolve_policy(Policy::Auto, cpu, &why) == Policy::MixedBFloat16);
  CHECK(why.find("native bf16 (avx512_core_amx)") != std::string::npos);
  cpu.native_bf16 = false, cpu.math_bf16 = "widened to float32 (MPX_CPU_16BIT=widen)";
  CHECK(resolve_policy(Policy::Auto, cpu, &why) == Policy::Float32);
  CHECK(why.find("MPX_CPU_16BIT=widen") != std::string::npos);
  // And this process's CPU backend, as `mpx train` resolves it.
  const DeviceInfo here = create_backend("cpu")->info();
  CHECK(resolve_policy(Policy::Auto, here, &why) == (here.native_bf16 ? Policy::MixedBFloat16 : Policy::Float32));
  CHECK(why.find(here.math_bf16) != std::string::npos);
}

TEST_CASE("resolve_device: cpu, and auto says why", "[train][policy]") {
  CHECK(resolve_device("cpu").device == "cpu");
  const ResolvedDevice d = resolve_device("auto");
  CHECK(!d.reason.empty());
  if (cuda_device_count() == 0) {
    CHECK(d.device == "cpu");
    // The reason matches how this mpx was built (the build's config header decides).
#if MPX_WITH_CUDA
    CHECK(d.reason == "device auto: no CUDA device found, using the CPU");
#else
    CHECK(d.reason == "device auto: this mpx was built without CUDA, using the CPU");
#endif
  }
}

TEST_CASE("precision_warnings", "[train][policy]") {
  Config c = parse(small_yaml("mixed_float16", "  name: adam\n", "loss_scale: {mode: none}\n"));
  auto w = precision_warnings(c, Policy::MixedFloat16, false);
  REQUIRE(w.size() == 1);  // f16 without loss scaling
  CHECK(w[0].find("loss_scale.mode none") != std::string::npos);

  c = parse(small_yaml("mixed_float16", "  name: adam\n", "",
                       "    - {type: flatten}\n    - {type: dense, units: 10, activation: softmax}\n"));
  w = precision_warnings(c, Policy::MixedFloat16, false);
  REQUIRE(w.size() == 1);  // softmax output layer in float16
  CHECK(w[0].find("softmax") != std::string::npos);
  CHECK(w[0].find("dtype: float32") != std::string::npos);

  c = parse(small_yaml("mixed_bfloat16", "  name: adam\n", "loss_scale: {mode: dynamic}\n",
                       "    - {type: flatten}\n    - {type: dense, units: 10, activation: softmax, dtype: float32}\n"));
  w = precision_warnings(c, Policy::MixedBFloat16, false);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("needs no loss scaling") != std::string::npos);

  c = parse(small_yaml("auto", "  name: adam\n"));
  w = precision_warnings(c, Policy::Float32, true);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("auto resolved to float32") != std::string::npos);
  CHECK(precision_warnings(parse(small_yaml("float32", "  name: adam\n")), Policy::Float32, false).empty());
}

// ---- the optimizer through the trainer ---------------------------------------

TEST_CASE("one SGD step through the trainer is master - lr * grad", "[train][optimizer]") {
  const fs::path d = temp_dir("sgd");
  const double lr = 0.05;
  const Config cfg = parse(small_yaml("float32", "  name: sgd\n  learning_rate: 0.05\n"),
                           {"data.shuffle=false", "train.max_steps=1", "train.log_every=1"});
  // The gradient of the first batch (records 0..31, unshuffled) from the model itself.
  const std::vector<float> g = gradients(Policy::Float32, 1.0, 1.0, cfg);
  auto be = create_backend("cpu");
  Model m0(cfg, Policy::Float32, *be, 28, 28, 1, 10, 32);
  m0.init_params(cfg.seed);
  std::vector<float> w0(static_cast<size_t>(m0.num_params()));
  be->download(w0.data(), m0.master());

  const TrainResult r = train(cfg, options(d / "run"));
  REQUIRE(r.status == "completed");
  CHECK(r.steps == 1);
  const Checkpoint ck = load_checkpoint((d / "run" / "checkpoints" / "last.ckpt").string());
  REQUIRE(ck.master.size() == w0.size());
  CHECK(ck.header.applied_updates == 1);
  CHECK(ck.header.global_step == 1);
  CHECK(ck.header.step_in_epoch == 1);
  size_t bad = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    const float want = w0[i] - static_cast<float>(lr) * g[i];
    if (std::fabs(ck.master[i] - want) > 1e-7f * std::max(1.0f, std::fabs(want))) ++bad;
  }
  CHECK(bad == 0);
  fs::remove_all(d);
}

// ---- loss scaling: overflow and underflow -----------------------------------

TEST_CASE("overflow: dynamic scaling from 2^30 skips, backs off, then trains", "[train][scaler]") {
  const fs::path d = temp_dir("overflow");
  const std::string yaml = small_yaml("mixed_float16", "  name: adam\n  learning_rate: 3.0e-3\n",
                                      "loss_scale: {mode: dynamic, initial: 1073741824, growth_interval: 1000}\n");

  // One step only: it is skipped, and the weights and optimizer state are untouched (bit-identical).
  Config one = parse(yaml, {"train.max_steps=1"});
  const TrainResult r1 = train(one, options(d / "one"));
  REQUIRE(r1.status == "completed");
  CHECK(r1.skipped_steps == 1);
  CHECK(r1.last_skip_reason == "backward_overflow");
  CHECK(r1.final_loss_scale == std::ldexp(1.0, 29));
  const Checkpoint ck = load_checkpoint((d / "one" / "checkpoints" / "last.ckpt").string());
  CHECK(ck.header.applied_updates == 1);  // Keras 2: the skipped step still advances the iterations
  auto be = create_backend("cpu");
  Model m0(one, Policy::MixedFloat16, *be, 28, 28, 1, 10, 32);
  m0.init_params(one.seed);
  std::vector<float> w0(static_cast<size_t>(m0.num_params()));
  be->download(w0.data(), m0.master());
  CHECK(same_bits(ck.master, w0));
  REQUIRE(ck.opt.size() == 2);  // Adam: m, v
  CHECK(std::all_of(ck.opt[0].begin(), ck.opt[0].end(), [](float v) { return v == 0.0f; }));
  CHECK(std::all_of(ck.opt[1].begin(), ck.opt[1].end(), [](float v) { return v == 0.0f; }));

  // Three epochs: the scale halves until the gradients are finite, then the loss goes down.
  Config cfg = parse(yaml, {"train.epochs=3"});
  const TrainResult r = train(cfg, options(d / "full"));
  REQUIRE(r.status == "completed");
  CHECK(r.skipped_steps >= 5);
  CHECK(r.skipped_steps < 20);
  CHECK(r.final_loss_scale < std::ldexp(1.0, 30));
  CHECK(r.final_loss_scale >= 1.0);
  const auto recs = read_jsonl(d / "full" / "metrics.jsonl");
  std::vector<double> epoch_loss;
  for (const auto& j : recs)
    if (j["kind"] == "epoch") epoch_loss.push_back(j["train_loss"].get<double>());
  REQUIRE(epoch_loss.size() == 3);
  CHECK(epoch_loss[2] < epoch_loss[0]);
  CHECK(r.final_test_accuracy > 0.5);
  fs::remove_all(d);
}

TEST_CASE("underflow: tiny gradients vanish in float16 without loss scaling, survive with it", "[train][scaler]") {
  // Every layer in float16, the output layer included (so the logit gradients are float16 too).
  const Config cfg = parse(small_yaml("mixed_float16", "  name: adam\n", "",
                                      "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
                                      "    - {type: max_pool, pool_size: 2}\n"
                                      "    - {type: flatten}\n"
                                      "    - {type: dense, units: 10, activation: softmax}\n"));
  // A loss 1e7 times smaller than cross-entropy: every logit gradient is below 2^-25 and rounds
  // to zero in float16. Gradients this small never overflow, so dynamic scaling grows S from
  // 2^15 (x2 every growth_interval steps); 2^20 is a scale it reaches.
  const double tiny = 1e-7;
  const std::vector<float> g32 = gradients(Policy::Float32, tiny, 1.0, cfg);
  const std::vector<float> g_none = gradients(Policy::MixedFloat16, tiny, 1.0, cfg);
  const std::vector<float> g_dyn = gradients(Policy::MixedFloat16, tiny, std::ldexp(1.0, 20), cfg);
  size_t zeros_none = 0, zeros_32 = 0;
  double err = 0, norm = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    zeros_none += g_none[i] == 0.0f;
    zeros_32 += g32[i] == 0.0f;
    err += (double(g_dyn[i]) - g32[i]) * (double(g_dyn[i]) - g32[i]);
    norm += double(g32[i]) * g32[i];
  }
  INFO("zeros: none " << zeros_none << ", float32 " << zeros_32 << " of " << g32.size());
  CHECK(zeros_none > g32.size() * 9 / 10);       // most weight gradients flushed to zero
  CHECK(zeros_32 < g32.size() / 2);
  CHECK(std::sqrt(err / norm) < 2e-2);           // with scaling: float32's within float16 tolerance
}

TEST_CASE("max_consecutive_skips through the trainer: diverged, naming the layer; check_numerics reports it",
          "[train][scaler]") {
  const fs::path d = temp_dir("skips");
  // Fixed S = 2^30 under mixed_float16: every backward overflows, S never backs off.
  const Config cfg = parse(small_yaml("mixed_float16", "  name: adam\n",
                                      "loss_scale: {mode: fixed, initial: 1073741824, max_consecutive_skips: 3}\n"
                                      "debug: {check_numerics: true}\n"));
  TrainResult r;
  {
    support::ExpectLogs logs;
    r = train(cfg, options(d / "run"));
    CHECK(logs.contains("check_numerics: step 0: first non-finite gradient"));
  }
  CHECK(r.status == "diverged");
  CHECK(r.exit_code == 4);
  CHECK(r.steps == 3);
  CHECK(r.skipped_steps == 3);
  CHECK(r.last_skip_reason == "backward_overflow");
  CHECK(r.final_loss_scale == std::ldexp(1.0, 30));
  CHECK(r.message.find("3 consecutive steps") != std::string::npos);
  CHECK(r.message.find("first non-finite gradient: ") != std::string::npos);
  CHECK(r.message.find("loss_scale.mode: dynamic") != std::string::npos);
  const json s = read_json(d / "run" / "summary.json");
  CHECK(s["status"] == "diverged");
  CHECK(s["skipped_steps"] == 3);
  CHECK(s["last_skip_reason"] == "backward_overflow");
  fs::remove_all(d);
}

TEST_CASE("weights.init_from starts training from a safetensors file", "[train][checkpoint]") {
  const fs::path d = temp_dir("init_from");
  const Config cfg = parse(small_yaml("float32", "  name: sgd\n  learning_rate: 1.0e-30\n"), {"train.max_steps=1"});
  auto be = create_backend("cpu");
  Model m(cfg, Policy::Float32, *be, 28, 28, 1, 10, 32);
  m.init_params(12345);  // another seed than the config's
  std::vector<float> w(static_cast<size_t>(m.num_params()));
  be->download(w.data(), m.master());
  write_safetensors((d / "w.safetensors").string(),
                    export_weights(m, *be, cfg, Shape{28, 28, 1}, WeightsLayout::Keras, {}));
  Config c2 = parse(small_yaml("float32", "  name: sgd\n  learning_rate: 1.0e-30\n"),
                    {"train.max_steps=1", "weights.init_from=" + (d / "w.safetensors").string()});
  REQUIRE(train(c2, options(d / "run")).status == "completed");
  const Checkpoint ck = load_checkpoint((d / "run" / "checkpoints" / "last.ckpt").string());
  // One SGD step of lr 1e-30: the imported weights, to float32 rounding.
  REQUIRE(ck.master.size() == w.size());
  size_t bad = 0;
  for (size_t i = 0; i < w.size(); ++i) bad += std::fabs(ck.master[i] - w[i]) > 1e-20f;
  CHECK(bad == 0);
  fs::remove_all(d);
}

// ---- resume -----------------------------------------------------------------

TEST_CASE("resume is bit-exact: 2 epochs = 1 + resume + 1 = interrupted + resume", "[train][checkpoint]") {
  // mixed_bfloat16 too: on a CPU with AMX its convolution and dense layers run on oneDNN's
  // native bf16 kernels (docs/precision.md), which must be as repeatable as the widened path.
  const std::string policy = GENERATE(std::string("mixed_float16"), std::string("mixed_bfloat16"));
  INFO(policy);
  const fs::path d = temp_dir("resume_" + policy);
  // mixed_float16 + dynamic scaling (scaler state), batch norm (state arena), dropout (seeded by step), Adam;
  // the second convolution runs as a Winograd convolution by default (docs/cpu-performance.md).
  const std::string layers =
      "    - {type: conv2d, filters: 16, kernel: 3, use_bias: false}\n"
      "    - {type: batch_norm}\n"
      "    - {type: activation, activation: relu}\n"
      "    - {type: conv2d, filters: 16, kernel: 3, padding: same, activation: relu}\n"
      "    - {type: max_pool, pool_size: 2}\n"
      "    - {type: flatten}\n"
      "    - {type: dropout, rate: 0.25}\n"
      "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n";
  const std::string yaml =
      small_yaml(policy, "  name: adam\n  learning_rate: 2.0e-3\n",
                 policy == "mixed_float16" ? "loss_scale: {growth_interval: 5}\n" : "", layers);
  const Config two = parse(yaml, {"train.epochs=2"});
  const Config one = parse(yaml, {"train.epochs=1"});

  const TrainResult a = train(two, options(d / "straight"));
  REQUIRE(a.status == "completed");
  CHECK(a.epochs == 2);

  const TrainResult b1 = train(one, options(d / "split"));
  REQUIRE(b1.status == "completed");
  const TrainResult b2 = train(two, options(d / "split", (d / "split").string()));
  REQUIRE(b2.status == "completed");
  CHECK(b2.epochs == 2);
  CHECK(b2.steps == a.steps);

  stop_requested() = true;  // as if SIGINT arrived during the first step
  const TrainResult c1 = train(two, options(d / "intr"));
  stop_requested() = false;
  CHECK(c1.status == "interrupted");
  CHECK(c1.exit_code == 130);
  CHECK(c1.steps == 1);
  CHECK(read_json(d / "intr" / "summary.json")["status"] == "interrupted");
  const TrainResult c2 = train(two, options(d / "intr", (d / "intr" / "checkpoints" / "last.ckpt").string()));
  REQUIRE(c2.status == "completed");

  const Checkpoint ka = load_checkpoint((d / "straight" / "checkpoints" / "last.ckpt").string());
  for (const char* run : {"split", "intr"}) {
    INFO(run);
    const Checkpoint kb = load_checkpoint((d / run / "checkpoints" / "last.ckpt").string());
    CHECK(same_bits(ka.master, kb.master));
    CHECK(same_bits(ka.state, kb.state));
    REQUIRE(ka.opt.size() == kb.opt.size());
    for (size_t i = 0; i < ka.opt.size(); ++i) CHECK(same_bits(ka.opt[i], kb.opt[i]));
    CHECK(ka.header.applied_updates == kb.header.applied_updates);
    CHECK(ka.header.scaler.scale == kb.header.scaler.scale);
    CHECK(ka.header.scaler.skipped_total == kb.header.scaler.skipped_total);
    CHECK(ka.header.global_step == kb.header.global_step);
  }
  const TrainResult& b = b2;
  CHECK(b.final_test_accuracy == a.final_test_accuracy);
  CHECK(b.final_train_loss == a.final_train_loss);
  CHECK(c2.final_train_loss == a.final_train_loss);  // the partial epoch's sums were checkpointed too
  // The resumed run appended to the same metrics.jsonl: two epoch records.
  int epochs = 0;
  for (const auto& j : read_jsonl(d / "split" / "metrics.jsonl")) epochs += j["kind"] == "epoch";
  CHECK(epochs == 2);

  // evaluate_checkpoint reproduces the final test accuracy, deterministically.
  const EvalResult e1 = evaluate_checkpoint(two, (d / "straight").string());
  const EvalResult e2 = evaluate_checkpoint(two, (d / "straight" / "checkpoints" / "last.ckpt").string());
  CHECK(e1.accuracy == a.final_test_accuracy);
  CHECK(e1.loss == e2.loss);
  CHECK(e1.count == 128);
  CHECK(e1.policy == policy);
  fs::remove_all(d);
}

TEST_CASE("resuming with a checkpoint of another model is an exit-2 error naming both sizes", "[train][checkpoint]") {
  const fs::path d = temp_dir("mismatch");
  const Config small = parse(small_yaml("float32", "  name: adam\n"), {"train.max_steps=2"});
  REQUIRE(train(small, options(d / "a")).status == "completed");
  const Checkpoint ck = load_checkpoint((d / "a" / "checkpoints" / "last.ckpt").string());

  Config big = parse(small_yaml("float32", "  name: adam\n"), {"train.max_steps=2", "model.layers[0].filters=8"});
  TrainResult r;
  {
    support::ExpectLogs logs;
    r = train(big, options(d / "b", (d / "a").string()));
    CHECK(logs.contains("parameters"));
  }
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 2);
  CHECK(r.message.find(std::to_string(ck.header.num_params)) != std::string::npos);
  auto be = create_backend("cpu");
  Model m(big, Policy::Float32, *be, 28, 28, 1, 10, 32);
  CHECK(r.message.find(std::to_string(m.num_params())) != std::string::npos);
  CHECK(read_json(d / "b" / "summary.json")["exit_code"] == 2);
  CHECK_THROWS_AS(evaluate_checkpoint(big, (d / "a").string()), ConfigError);

  // A corrupt checkpoint is exit 3, thrown before any run directory is made.
  const std::string path = (d / "a" / "checkpoints" / "last.ckpt").string();
  fs::resize_file(path, fs::file_size(path) - 8);
  try {
    train(small, options(d / "c", path));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 3);
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
  CHECK_FALSE(fs::exists(d / "c"));
  fs::remove_all(d);
}

// ---- divergence and the run directory ---------------------------------------

TEST_CASE("a non-finite float32 loss is 'diverged', exit 4, with a complete run directory", "[train][diverge]") {
  const fs::path d = temp_dir("diverge");
  const std::string yaml = small_yaml("float32", "  name: sgd\n  learning_rate: 1.0e10\n");
  // divergence_factor 0: the loss runs on to inf/NaN (the finite blow-up check would stop it first).
  const Config cfg = parse(yaml, {"train.epochs=20", "train.log_every=1", "train.divergence_factor=0"});
  TrainResult r;
  {
    support::ExpectLogs logs;
    r = train(cfg, options(d / "run"));
    CHECK(logs.contains("diverged"));
  }
  CHECK(r.status == "diverged");
  CHECK(r.exit_code == 4);
  CHECK(r.message.find("float32") != std::string::npos);
  CHECK(r.message.find("the loss is ") != std::string::npos);  // NaN or inf, not a finite blow-up
  CHECK(r.message.find("learning_rate") != std::string::npos);

  const json s = read_json(d / "run" / "summary.json");
  CHECK(s["status"] == "diverged");
  CHECK(s["exit_code"] == 4);
  for (const char* k : {"message", "epochs", "steps", "final_test_accuracy", "best_test_accuracy", "final_train_loss",
                        "images_per_sec", "wall_seconds", "skipped_steps", "final_loss_scale", "last_skip_reason",
                        "peak_memory_bytes", "policy", "device", "eval_policy", "memory"})
    CHECK(s.contains(k));
  CHECK(s["policy"] == "float32");
  CHECK(s["device"] == "cpu");
  CHECK(s["memory"]["master_bytes"].get<int64_t>() > 0);
  CHECK(s["peak_memory_bytes"].get<int64_t>() > 0);

  // config.yaml loads back to the same text.
  const std::string text = read_text(d / "run" / "config.yaml");
  CHECK(to_yaml(parse_config(text, "config.yaml")) == text);
  const Config back = load_config((d / "run" / "config.yaml").string());
  CHECK(back.optimizer.learning_rate == 1e10);
  CHECK(back.loss_scale.mode == LossScaleMode::None);

  const auto recs = read_jsonl(d / "run" / "metrics.jsonl");
  REQUIRE(!recs.empty());
  for (const auto& j : recs) {
    if (j["kind"] == "step") {
      for (const char* k : {"step", "epoch", "loss", "accuracy", "learning_rate", "loss_scale", "skipped_steps",
                            "images_per_sec", "memory_bytes"})
        CHECK(j.contains(k));
    } else {
      CHECK(j["kind"] == "epoch");
      for (const char* k : {"epoch", "step", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                            "learning_rate", "loss_scale", "skipped_steps", "last_skip_reason", "images_per_sec",
                            "wall_seconds"})
        CHECK(j.contains(k));
    }
  }
  CHECK(fs::exists(d / "run" / "train.log"));
  CHECK(read_text(d / "run" / "train.log").find("diverged") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("missing data after the run directory exists: exit 3 and summary.json", "[train][diverge]") {
  const fs::path d = temp_dir("nodata");
  std::string yaml = small_yaml("float32", "  name: adam\n");
  const Config cfg = parse(yaml, {"data.dataset=mnist", "data.path=" + (d / "nowhere").string()});
  TrainResult r;
  {
    support::ExpectLogs logs;
    r = train(cfg, options(d / "run"));
  }
  CHECK(r.exit_code == 3);
  CHECK(r.status == "failed");
  CHECK(read_json(d / "run" / "summary.json")["exit_code"] == 3);
  fs::remove_all(d);
}

TEST_CASE("float32 evaluation of a mixed-precision run, and bench", "[train]") {
  const fs::path d = temp_dir("evalf32");
  const Config cfg = parse(small_yaml("mixed_bfloat16", "  name: adam\n"), {"train.eval_policy=float32"});
  const TrainResult r = train(cfg, options(d / "run"));
  REQUIRE(r.status == "completed");
  CHECK(r.eval_policy == "float32");
  CHECK(r.policy == "mixed_bfloat16");
  CHECK(read_json(d / "run" / "summary.json")["eval_policy"] == "float32");
  CHECK(r.final_test_accuracy > 0.3);
  CHECK(fs::exists(d / "run" / "checkpoints" / "best.ckpt"));

  const BenchResult b = bench(cfg, 3, 1);
  CHECK(b.steps == 3);
  CHECK(b.images_per_sec > 0);
  CHECK(b.step_ms_min <= b.step_ms_median);
  CHECK(b.step_ms_median <= b.step_ms_max);
  CHECK(b.peak_memory_bytes > 0);
  CHECK(b.policy == "mixed_bfloat16");
  fs::remove_all(d);
}

// ---- end to end on MNIST ----------------------------------------------------

TEST_CASE("MNIST smoke net: one epoch >= 97% under float32, mixed_float16 and mixed_bfloat16", "[train][e2e][.]") {
  const std::string mnist = std::string(MPX_SHARED_DATA) + "/mnist";
  if (!fs::exists(mnist + "/train-images-idx3-ubyte.gz") && !fs::exists(mnist + "/train-images-idx3-ubyte")) {
    MPX_SKIP("no MNIST under " + mnist);
  }
  const fs::path d = temp_dir("e2e");
  // The shipped smoke config (adam 2e-3: configs/mnist_smoke.yaml measured 1e-3 at ~97.3% after one
  // epoch, below the target), with the output layer in float32 as Keras recommends for mixed precision.
  const std::vector<std::string> sets = {"device=cpu", "data.path=" + mnist, "model.layers[3].dtype=float32",
                                         "train.log_every=100"};
  const Config base = load_config(std::string(MPX_SOURCE_DIR) + "/configs/mnist_smoke.yaml", sets);
  const std::string yaml = to_yaml(base);
  double acc[3];
  const char* policies[3] = {"float32", "mixed_float16", "mixed_bfloat16"};
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const TrainResult r = train(parse(yaml, {std::string("policy=") + policies[i]}), options(d / policies[i]));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(r.status == "completed");
    acc[i] = r.final_test_accuracy;
    std::printf("e2e %s: test accuracy %.4f, %.1f s, %.0f img/s, %lld skipped\n", policies[i], acc[i], s,
                r.images_per_sec, static_cast<long long>(r.skipped_steps));
    CHECK(acc[i] >= 0.97);
  }
  CHECK(std::fabs(acc[1] - acc[0]) <= 0.005);
  CHECK(std::fabs(acc[2] - acc[0]) <= 0.005);
  fs::remove_all(d);
}
