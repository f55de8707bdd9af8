// SPDX-License-Identifier: MIT
// End-to-end tests of weights in and out through the `mpx` binary: export ->
// eval --weights / weights.init_from round trips in both layouts, rejected files
// (exit 2, tensor named), and `mpx inspect` finding the layer that overflows float16.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "core/half.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "nn/model.h"
#include "support/cli.h"
#include "weights/weights.h"

namespace fs = std::filesystem;
using namespace mpx;

namespace {

using support::Run;
using support::run_mpx;

struct TempDir : support::TempDir {
  TempDir() : support::TempDir("mpx_weights") {}
};

std::string read_bytes(const fs::path& p) { return support::read_file(p); }
void write_bytes(const fs::path& p, const std::string& s) { support::write_file(p, s); }

// A small net with every parameter kind: conv, batch_norm, a residual block with a projection, dense.
const char* kConfig = R"(name: wt
seed: 3
device: cpu
policy: float32
data: {dataset: synthetic, batch_size: 32, synthetic_train: 64, synthetic_test: 64}
model:
  layers:
    - {type: conv2d, filters: 8, kernel: 3, padding: same, activation: relu}
    - {type: batch_norm}
    - type: residual
      layers:
        - {type: conv2d, filters: 16, kernel: 3, strides: 2, padding: same}
        - {type: batch_norm}
        - {type: activation, activation: relu}
    - {type: max_pool, pool_size: 2}
    - {type: flatten}
    - {type: dense, units: 16, activation: relu, name: hidden}
    - {type: dense, units: 10, activation: softmax, name: out}
optimizer: {name: adam}
train: {epochs: 1, log_every: 1}
)";

/// mpx_float16 net for the overflow test: the float32 output layer as the Keras guides have it.
const char* kFp16Config = R"(name: ovf
seed: 5
device: cpu
policy: mixed_float16
data: {dataset: synthetic, batch_size: 16, synthetic_train: 32, synthetic_test: 32}
model:
  layers:
    - {type: conv2d, filters: 8, kernel: 3, activation: relu}
    - {type: max_pool, pool_size: 2}
    - {type: flatten}
    - {type: dense, units: 32, activation: relu, name: hidden}
    - {type: dense, units: 16, activation: relu, name: hidden2}
    - {type: dense, units: 10, activation: softmax, dtype: float32, name: out}
)";

struct Fixture {
  TempDir dir;
  Fixture() {
    write_bytes(dir.path / "wt.yaml", kConfig);
    write_bytes(dir.path / "ovf.yaml", kFp16Config);
  }
  fs::path at(const std::string& f) const { return dir.path / f; }
  /// Trains one short epoch into run/ (a checkpoint to export).
  void train() {
    const Run t = run_mpx("train --config wt.yaml --run-dir run --no-progress", dir.path);
    REQUIRE(t.code == 0);
  }
};

/// The master + state of `weights` loaded into the model of `config_text` (on 28x28x1 inputs).
std::pair<std::vector<float>, std::vector<float>> load_into_model(const std::string& config_text,
                                                                  const fs::path& weights) {
  const Config cfg = parse_config(config_text, "c.yaml");
  auto be = create_backend("cpu");
  Model m(cfg, Policy::Float32, *be, 28, 28, 1, 10, 1);
  m.init_params(99);
  import_weights(m, *be, cfg, Shape{28, 28, 1}, weights.string());
  std::vector<float> master(static_cast<size_t>(m.num_params())), state(static_cast<size_t>(m.num_state()));
  be->download(master.data(), m.master());
  if (m.num_state() > 0) be->download(state.data(), m.state());  // a net without batch_norm has none
  return {master, state};
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

StTensor* find_mut(StFile& f, const std::string& name) {
  for (StTensor& t : f.tensors)
    if (t.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

}  // namespace

TEST_CASE("cli weights: export -> eval --weights reproduces the checkpoint exactly, both layouts", "[cli][weights]") {
  Fixture f;
  f.train();
  const Run ck = run_mpx("eval --config wt.yaml --checkpoint run --json", f.dir.path);
  REQUIRE(ck.code == 0);
  const Checkpoint c = load_checkpoint((f.at("run") / "checkpoints" / "last.ckpt").string());
  for (const char* layout : {"keras", "pytorch"}) {
    INFO("layout " << layout);
    const std::string out = std::string("w_") + layout + ".safetensors";
    const Run e = run_mpx("export --config wt.yaml --checkpoint run --out " + out + " --layout " + layout, f.dir.path);
    REQUIRE(e.code == 0);
    CHECK_THAT(e.err, Catch::Contains(std::string(layout) + " layout"));
    const StFile file = read_safetensors(f.at(out).string());
    CHECK(file.metadata.at("config") == "wt");
    CHECK(file.metadata.at("policy") == "float32");
    CHECK(file.metadata.at("layout") == layout);
    CHECK(file.metadata.count("mpx_version") == 1);
    CHECK(file.find(std::string(layout) == "keras" ? "batch_norm/moving_variance" : "batch_norm.running_var"));
    // Bit-identical master weights and moving statistics after the import.
    const auto [master, state] = load_into_model(kConfig, f.at(out));
    CHECK(bit_equal(master, c.master));
    CHECK(bit_equal(state, c.state));
    // Equal weights, equal evaluation, to the last digit.
    const Run w = run_mpx("eval --config wt.yaml --weights " + out + " --json", f.dir.path);
    REQUIRE(w.code == 0);
    CHECK(w.out == ck.out);
  }
  // No temporary file left next to the output.
  for (const auto& e : fs::directory_iterator(f.dir.path))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

// A depthwise_conv2d (depth multiplier 2) between two convolutions: its kernel has a layout
// of its own in both files (Keras depthwise_kernel [R, S, C, M], PyTorch [C*M, 1, R, S]).
const char* kDepthwiseConfig = R"(name: dw
seed: 4
device: cpu
policy: float32
data: {dataset: synthetic, batch_size: 32, synthetic_train: 64, synthetic_test: 64}
model:
  layers:
    - {type: conv2d, filters: 3, kernel: 3, padding: same, activation: relu}
    - {type: depthwise_conv2d, kernel: [3, 2], depth_multiplier: 2, strides: 2, padding: same, activation: relu}
    - {type: global_avg_pool}
    - {type: dense, units: 10, activation: softmax, name: out}
optimizer: {name: adam}
train: {epochs: 1, log_every: 1}
)";

TEST_CASE("cli weights: a depthwise_conv2d kernel in the keras and pytorch layouts, read back", "[cli][weights]") {
  Fixture f;
  write_bytes(f.at("dw.yaml"), kDepthwiseConfig);
  REQUIRE(run_mpx("train --config dw.yaml --run-dir run --no-progress", f.dir.path).code == 0);
  const Checkpoint c = load_checkpoint((f.at("run") / "checkpoints" / "last.ckpt").string());
  const Run ck = run_mpx("eval --config dw.yaml --checkpoint run --json", f.dir.path);
  REQUIRE(ck.code == 0);
  // Where the kernel [C*M, R, S, 1] = [6, 3, 2, 1] lies in the master arena.
  const Config cfg = parse_config(kDepthwiseConfig, "dw.yaml");
  auto be = create_backend("cpu");
  Model m(cfg, Policy::Float32, *be, 28, 28, 1, 10, 1);
  const ParamInfo* kernel = nullptr;
  for (const ParamInfo& p : m.params())
    if (p.layer == "depthwise_conv2d" && p.name == "depthwise_kernel") kernel = &p;
  REQUIRE(kernel);
  REQUIRE(kernel->shape == Shape{6, 3, 2, 1});
  const int64_t C = 3, M = 2, R = 3, S = 2;
  const auto model_at = [&](int64_t ch, int64_t mi, int64_t r, int64_t s) {
    return c.master[static_cast<size_t>(kernel->offset + ((ch * M + mi) * R + r) * S + s)];
  };
  for (const char* layout : {"keras", "pytorch"}) {
    INFO("layout " << layout);
    const bool keras = std::string(layout) == "keras";
    const std::string out = std::string("dw_") + layout + ".safetensors";
    REQUIRE(run_mpx("export --config dw.yaml --checkpoint run --out " + out + " --layout " + layout, f.dir.path)
                .code == 0);
    const StFile file = read_safetensors(f.at(out).string());
    const StTensor* t = file.find(keras ? "depthwise_conv2d/depthwise_kernel" : "depthwise_conv2d.weight");
    REQUIRE(t);
    REQUIRE(t->dtype == "F32");
    CHECK(t->shape == (keras ? std::vector<int64_t>{R, S, C, M} : std::vector<int64_t>{C * M, 1, R, S}));
    CHECK(file.find(keras ? "depthwise_conv2d/bias" : "depthwise_conv2d.bias"));
    std::vector<float> v(static_cast<size_t>(t->numel()));
    std::memcpy(v.data(), t->bytes.data(), v.size() * 4);
    // Every element where the layout puts it: Keras [r][s][c][m], PyTorch [c*M + m][0][r][s].
    for (int64_t ci = 0; ci < C; ++ci)
      for (int64_t mi = 0; mi < M; ++mi)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t s = 0; s < S; ++s) {
            const size_t i = static_cast<size_t>(keras ? ((r * S + s) * C + ci) * M + mi : ((ci * M + mi) * R + r) * S + s);
            REQUIRE(v[i] == model_at(ci, mi, r, s));
          }
    // Read back: the same master weights bit for bit, the same evaluation.
    const auto [master, state] = load_into_model(kDepthwiseConfig, f.at(out));
    CHECK(bit_equal(master, c.master));
    const Run w = run_mpx("eval --config dw.yaml --weights " + out + " --json", f.dir.path);
    REQUIRE(w.code == 0);
    CHECK(w.out == ck.out);
  }
}

TEST_CASE("cli weights: weights.init_from loads a file (train, export)", "[cli][weights]") {
  Fixture f;
  f.train();
  REQUIRE(run_mpx("export --config wt.yaml --checkpoint run --out w.safetensors --layout pytorch", f.dir.path).code == 0);
  // Exported again from init_from (no checkpoint): the same tensors, converted to keras.
  const Run e = run_mpx("export --config wt.yaml --set weights.init_from=w.safetensors --out again.safetensors",
                        f.dir.path);
  REQUIRE(e.code == 0);
  const auto a = load_into_model(kConfig, f.at("w.safetensors"));
  const auto b = load_into_model(kConfig, f.at("again.safetensors"));
  CHECK(bit_equal(a.first, b.first));
  CHECK(bit_equal(a.second, b.second));
  CHECK(read_safetensors(f.at("again.safetensors").string()).metadata.at("layout") == "keras");

  // train starts from the file: its first logged loss is the exported model's loss, not a fresh init's.
  const Run t = run_mpx("train --config wt.yaml --set weights.init_from=w.safetensors --set train.max_steps=1 "
                        "--run-dir run2 --no-progress",
                        f.dir.path);
  CHECK(t.code == 0);
  CHECK_THAT(t.err, Catch::Contains("weights: " + f.at("w.safetensors").string() + " (pytorch layout)"));

  // The resolved config.yaml keeps the key, as an absolute path (--set values follow the current folder).
  const Config resolved = load_config((f.at("run2") / "config.yaml").string());
  CHECK(resolved.weights.init_from == f.at("w.safetensors").string());
}

TEST_CASE("cli weights: bad files are rejected with exit 2 and the tensor named", "[cli][weights]") {
  Fixture f;
  REQUIRE(run_mpx("export --config wt.yaml --out good.safetensors", f.dir.path).code == 0);
  CHECK(run_mpx("eval --config wt.yaml --weights good.safetensors", f.dir.path).code == 0);
  const StFile good = read_safetensors(f.at("good.safetensors").string());
  const std::string good_bytes = read_bytes(f.at("good.safetensors"));

  auto expect_rejected = [&](const std::string& name, const std::string& bytes, const std::string& needle) {
    INFO(name);
    write_bytes(f.at(name), bytes);
    const Run r = run_mpx("eval --config wt.yaml --weights " + name, f.dir.path);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(name));
    CHECK_THAT(r.err, Catch::Contains(needle));
    // The same through the config key, for train.
    const Run t = run_mpx("train --config wt.yaml --set weights.init_from=" + name + " --run-dir run_" + name +
                              " --no-progress",
                          f.dir.path);
    CHECK(t.code == 2);
    CHECK_THAT(t.err, Catch::Contains(needle));
  };

  StFile x = good;
  find_mut(x, "hidden/kernel")->shape = {16, 784};
  expect_rejected("shape.safetensors", serialize_safetensors(x),
                  "tensor 'hidden/kernel' has shape [16, 784] in the file, the model (config 'wt', keras layout) "
                  "expects [784, 16]");

  x = good;
  x.tensors.erase(x.tensors.begin() + 1);
  expect_rejected("missing.safetensors", serialize_safetensors(x),
                  "tensor '" + good.tensors[1].name + "' (layer");

  x = good;
  const float v[1] = {1};
  x.tensors.push_back(make_st_tensor("extra/kernel", DType::F32, {1}, v));
  expect_rejected("extra.safetensors", serialize_safetensors(x), "tensor 'extra/kernel' (F32 [1]) is not a parameter");

  // Truncated data: the last tensor (in data order) reaches beyond the end.
  expect_rejected("truncated.safetensors", good_bytes.substr(0, good_bytes.size() - 6),
                  "tensor '" + good.tensors.back().name + "': data_offsets");

  // A header lying about offsets: the second tensor's begin moved back into the first.
  uint64_t n = 0;
  std::memcpy(&n, good_bytes.data(), 8);
  std::string header = good_bytes.substr(8, n);
  const std::string second = good.tensors[1].name;
  const size_t at = header.find("\"" + second + "\"");
  REQUIRE(at != std::string::npos);
  const size_t offs = header.find("\"data_offsets\":[", at);
  const size_t comma = header.find(',', offs);
  const std::string begin = header.substr(offs + 16, comma - offs - 16);
  const std::string lied = std::to_string(std::stoll(begin) - 4);
  header.replace(offs + 16, begin.size(), lied);
  header.resize(n, ' ');  // keep the length (the number got at most shorter)
  std::string lying = good_bytes;
  lying.replace(8, n, header);
  expect_rejected("lying.safetensors", lying, "tensor '" + second + "': data_offsets [" + lied);

  // Header length beyond the file; not JSON.
  std::string big = good_bytes;
  big[6] = 1;
  expect_rejected("biglen.safetensors", big, "is larger than the rest of the file");
  std::string bad_json = good_bytes;
  bad_json[8] = '[';
  expect_rejected("json.safetensors", bad_json, "the header is not valid JSON");
}

TEST_CASE("cli weights: inspect reports the layer that overflows float16 as the first non-finite one",
          "[cli][weights][inspect]") {
  Fixture f;
  REQUIRE(run_mpx("export --config ovf.yaml --out ovf.safetensors", f.dir.path).code == 0);

  SECTION("the exported initial weights are finite everywhere") {
    const Run r = run_mpx("inspect --config ovf.yaml --weights ovf.safetensors --batch 8 --out dump.safetensors",
                          f.dir.path);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("every activation and gradient is finite"));
    CHECK_THAT(r.out, Catch::Contains("loss scale 32768"));
    const StFile d = read_safetensors(f.at("dump.safetensors").string());
    CHECK(d.find("conv2d/output")->dtype == "F16");
    CHECK(d.find("conv2d/output")->shape == std::vector<int64_t>{8, 26, 26, 8});
    CHECK(d.find("hidden/input_grad")->dtype == "F16");
    CHECK(d.find("out/output")->dtype == "F32");
    CHECK(d.find("grads/hidden/kernel")->shape == std::vector<int64_t>{1352, 32});
    CHECK(d.find("logits")->shape == std::vector<int64_t>{8, 10});
    CHECK(d.find("eval/logits")->dtype == "F32");
    CHECK(d.find("labels")->dtype == "I32");
    CHECK(st_to_float32(*d.find("loss_scale"), "d") == std::vector<float>{32768.0f});
    CHECK(d.metadata.at("policy") == "mixed_float16");
  }

  SECTION("a dense kernel scaled by 1e5 overflows in that layer") {
    StFile w = read_safetensors(f.at("ovf.safetensors").string());
    StTensor* k = find_mut(w, "hidden/kernel");
    std::vector<float> v = st_to_float32(*k, "w");
    for (float& x : v) x = std::fabs(x) * 1e5f;  // all positive: the sums overflow float16 (65504)
    *k = make_st_tensor(k->name, DType::F32, k->shape, v.data());
    write_safetensors(f.at("big.safetensors").string(), w);

    const Run r = run_mpx("inspect --config ovf.yaml --weights big.safetensors --batch 8 --out dump.safetensors",
                          f.dir.path);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("first non-finite: hidden (dense): float16 output:"));
    const StFile d = read_safetensors(f.at("dump.safetensors").string());
    CHECK(d.metadata.at("first_nonfinite").rfind("hidden (dense)", 0) == 0);
    // The layer before it is finite, its own float16 output holds inf.
    const StTensor& conv = *d.find("conv2d/output");
    for (float x : st_to_float32(conv, "d")) REQUIRE(std::isfinite(x));
    int infs = 0;
    for (float x : st_to_float32(*d.find("hidden/output"), "d")) infs += std::isinf(x) ? 1 : 0;
    CHECK(infs > 0);

    // Under float32 the same weights stay finite.
    const Run f32 = run_mpx("inspect --config ovf.yaml --set policy=float32 --weights big.safetensors --batch 8",
                            f.dir.path);
    REQUIRE(f32.code == 0);
    CHECK_THAT(f32.out, Catch::Contains("every activation and gradient is finite"));
    CHECK_THAT(f32.out, Catch::Contains("loss scale 1"));
  }
}

TEST_CASE("cli weights: command-line errors", "[cli][weights]") {
  Fixture f;
  CHECK(run_mpx("eval --config wt.yaml", f.dir.path).code == 2);
  CHECK(run_mpx("export --config wt.yaml --out x.safetensors --layout onnx", f.dir.path).code == 2);
  CHECK(run_mpx("inspect --config wt.yaml --weights nope.safetensors", f.dir.path).code == 2);
  const Run r = run_mpx("export --config wt.yaml --set weights.init_from=nope.safetensors --out x.safetensors",
                        f.dir.path);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("nope.safetensors: cannot open weights file"));
}
