// SPDX-License-Identifier: MIT
// `mpx devices` and `mpx bench` say which oneDNN runs and which of its kernels the timed
// steps chose (docs/cpu-performance.md, "Which oneDNN"): the version the loaded library
// reports is the one this build compiled against, and every convolution of a small
// net is listed with an implementation name.
#include <catch2/catch.hpp>
#include <mpx/config.hpp>
#include <nlohmann/json.hpp>

#include <stdlib.h>

#include <regex>
#include <set>
#include <string>

#include "support/cli.h"

using nlohmann::json;
using support::Run;
using support::run_mpx;

namespace {

// On the synthetic data set (28x28x1): conv 3x3 (1 -> 16 channels) then conv 3x3 stride 2 (16 -> 16).
const char* kConfig =
    "name: cli_onednn\n"
    "seed: 5\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, train_limit: 32, test_limit: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 16, kernel: 3, padding: same, activation: relu}\n"
    "    - {type: conv2d, filters: 16, kernel: 3, strides: 2, activation: relu}\n"
    "    - {type: global_avg_pool}\n"
    "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n";

/// The implementation `mpx bench --json` (run r) lists for op; "" when it lists none.
std::string impl_of(const Run& r, const std::string& op) {
  REQUIRE(r.code == 0);
  const json j = json::parse(r.out);
  for (const json& k : j.at("kernels"))
    if (k.at("op").get<std::string>() == op) return k.at("impl").get<std::string>();
  return std::string();
}

/// "oneDNN X.Y.Z (...)" -> "X.Y.Z"; "" when the text is not of that form.
std::string version_of(const std::string& library) {
  static const std::regex re("^oneDNN ([0-9]+\\.[0-9]+\\.[0-9]+) \\(commit [^;]+; (.*libdnnl\\.so[^)]*)\\)$");
  std::smatch m;
  return std::regex_match(library, m, re) ? m[1].str() : std::string();
}

}  // namespace

TEST_CASE("devices names the oneDNN that is loaded, the one the build compiled against", "[cli][devices]") {
  support::TempDir t("mpx_cli_onednn");
  const Run j = run_mpx("devices --json", t.path);
  REQUIRE(j.code == 0);
  const json d = json::parse(j.out);
  const std::string lib = d.at("cpu").at("library").get<std::string>();
  INFO(lib);
  CHECK(version_of(lib) == MPX_ONEDNN_VERSION);
  const Run r = run_mpx("devices", t.path);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("library       " + lib) != std::string::npos);
}

TEST_CASE("bench lists the oneDNN kernels of every convolution pass", "[cli][bench]") {
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "c.yaml", kConfig);
  const Run r = run_mpx("bench --config c.yaml --steps 2 --warmup 1 --json", t.path);
  REQUIRE(r.code == 0);
  const json j = json::parse(r.out);
  CHECK(version_of(j.at("library").get<std::string>()) == MPX_ONEDNN_VERSION);
  std::set<std::string> conv_ops;
  for (const json& k : j.at("kernels")) {
    const std::string op = k.at("op").get<std::string>(), impl = k.at("impl").get<std::string>();
    INFO(op << ": " << impl);
    CHECK(!impl.empty());
    if (op.rfind("convolution ", 0) == 0) conv_ops.insert(op);
  }
  // Forward of both layers, backward weights of both, backward data of the second only
  // (the first layer's input needs no gradient).
  const std::string w1 = "x [8, 28, 28, 1], w [16, 3, 3, 1]", w2 = "x [8, 28, 28, 16], w [16, 3, 3, 16]";
  for (const std::string& want : {"convolution forward for " + w1, "convolution forward for " + w2,
                                  "convolution backward weights for " + w1, "convolution backward weights for " + w2,
                                  "convolution backward data for " + w2}) {
    INFO(want);
    CHECK(conv_ops.count(want) == 1);
  }
  CHECK(conv_ops.size() == 5);

  const Run text = run_mpx("bench --config c.yaml --steps 1 --warmup 0", t.path);
  REQUIRE(text.code == 0);
  CHECK(text.out.find("library      oneDNN " MPX_ONEDNN_VERSION) != std::string::npos);
  CHECK(text.out.find("kernels\n") != std::string::npos);
  CHECK(text.out.find(" convolution backward weights for " + w2 + "\n") != std::string::npos);
}

TEST_CASE("MPX_CONV_WGRAD=gemm puts stride-1 weight gradients on the GEMM kernel; a bad value is exit 2",
          "[cli][bench]") {
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "c.yaml", kConfig);
  ::setenv("MPX_CONV_WGRAD", "gemm", 1);
  const Run r = run_mpx("bench --config c.yaml --steps 1 --warmup 0 --json", t.path);
  ::setenv("MPX_CONV_WGRAD", "fastest", 1);
  const Run bad = run_mpx("bench --config c.yaml --steps 1 --warmup 0", t.path);
  // A net whose only weight gradient is a few-channel one (the kernel that runs before any
  // other would have read the variable) rejects the bad value too.
  std::string first_only = kConfig;
  first_only.erase(first_only.find("    - {type: conv2d, filters: 16, kernel: 3, strides: 2"),
                   std::string("    - {type: conv2d, filters: 16, kernel: 3, strides: 2, activation: relu}\n").size());
  support::write_file(t.path / "first.yaml", first_only);
  const Run bad_first = run_mpx("bench --config first.yaml --steps 1 --warmup 0", t.path);
  ::unsetenv("MPX_CONV_WGRAD");
  REQUIRE(r.code == 0);
  std::string first, second;
  const json j = json::parse(r.out);
  for (const json& k : j.at("kernels")) {
    const std::string op = k.at("op").get<std::string>();
    if (op == "convolution backward weights for x [8, 28, 28, 1], w [16, 3, 3, 1]") first = k.at("impl").get<std::string>();
    if (op == "convolution backward weights for x [8, 28, 28, 16], w [16, 3, 3, 16]") second = k.at("impl").get<std::string>();
  }
  CHECK(first.rfind("gemm:sgemm", 0) == 0);            // stride 1
  CHECK(!second.empty());
  CHECK(second.find("gemm") == std::string::npos);     // stride 2: oneDNN's
  CHECK(bad.code == 2);
  CHECK(bad.err.find("MPX_CONV_WGRAD='fastest'") != std::string::npos);
  CHECK(bad_first.code == 2);
  CHECK(bad_first.err.find("MPX_CONV_WGRAD='fastest'") != std::string::npos);
}

TEST_CASE("MPX_CONV_FORWARD: 16-bit first layers run the few-channel forward kernel unless onednn; a bad value "
          "of it or MPX_DENSE_FEW is exit 2",
          "[cli][bench]") {
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "c.yaml", kConfig);
  const std::string cmd = "bench --config c.yaml --steps 1 --warmup 0 --json --set policy=mixed_bfloat16";
  ::setenv("MPX_CPU_16BIT", "widen", 1);  // oneDNN's native bf16 kernels (AMX) would take the layer first
  const Run def = run_mpx(cmd, t.path);
  ::setenv("MPX_CONV_FORWARD", "onednn", 1);
  const Run off = run_mpx(cmd, t.path);
  ::unsetenv("MPX_CPU_16BIT");
  ::setenv("MPX_CONV_FORWARD", "fast", 1);  // checked on every net, float32 too
  const Run bad = run_mpx("bench --config c.yaml --steps 1 --warmup 0", t.path);
  ::unsetenv("MPX_CONV_FORWARD");
  ::setenv("MPX_DENSE_FEW", "fast", 1);
  const Run bad_dense = run_mpx("bench --config c.yaml --steps 1 --warmup 0", t.path);
  ::unsetenv("MPX_DENSE_FEW");
  auto first_forward = [](const Run& r) {
    return impl_of(r, "convolution forward for x [8, 28, 28, 1], w [16, 3, 3, 1]");
  };
  const std::string on_impl = first_forward(def), off_impl = first_forward(off);
  CHECK(on_impl.rfind("mpx:few-channels", 0) == 0);
  CHECK(on_impl.find("bfloat16 rounded once in registers") != std::string::npos);
  CHECK(!off_impl.empty());
  CHECK(off_impl.rfind("mpx:", 0) == std::string::npos);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("MPX_CONV_FORWARD='fast'") != std::string::npos);
  CHECK(bad_dense.code == 2);
  CHECK(bad_dense.err.find("MPX_DENSE_FEW='fast'") != std::string::npos);
}

TEST_CASE("MPX_CONV_WINOGRAD: on puts 3x3 stride-1 convolutions on Winograd, off on oneDNN; a bad value is exit 2",
          "[cli][bench]") {
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "c.yaml", kConfig);
  auto forward_impls = [&](const char* mode) {
    ::setenv("MPX_CONV_WINOGRAD", mode, 1);
    const Run r = run_mpx("bench --config c.yaml --steps 1 --warmup 0 --json", t.path);
    ::unsetenv("MPX_CONV_WINOGRAD");
    REQUIRE(r.code == 0);
    std::pair<std::string, std::string> impl;  // first layer (3x3 stride 1), second (stride 2)
    const json j = json::parse(r.out);
    for (const json& k : j.at("kernels")) {
      const std::string op = k.at("op").get<std::string>();
      if (op == "convolution forward for x [8, 28, 28, 1], w [16, 3, 3, 1]") impl.first = k.at("impl").get<std::string>();
      if (op == "convolution forward for x [8, 28, 28, 16], w [16, 3, 3, 16]") impl.second = k.at("impl").get<std::string>();
    }
    return impl;
  };
  const auto on = forward_impls("on"), off = forward_impls("off"), f2 = forward_impls("f2");
  CHECK(on.first.rfind("winograd:F(4x4,3x3) ", 0) == 0);
  CHECK(f2.first.rfind("winograd:F(2x2,3x3) ", 0) == 0);
  CHECK(!off.first.empty());
  CHECK(off.first.find("winograd") == std::string::npos);
  for (const auto& i : {on, off, f2}) {  // stride 2: oneDNN's always
    CHECK(!i.second.empty());
    CHECK(i.second.find("winograd") == std::string::npos);
  }
  ::setenv("MPX_CONV_WINOGRAD", "fastest", 1);
  const Run bad = run_mpx("bench --config c.yaml --steps 1 --warmup 0", t.path);
  ::unsetenv("MPX_CONV_WINOGRAD");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("MPX_CONV_WINOGRAD='fastest'") != std::string::npos);
}

TEST_CASE("bench and devices say which 16-bit path ran; MPX_CPU_16BIT=widen forces the widened one",
          "[cli][bench][devices]") {
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "c.yaml", kConfig);
  const Run dev = run_mpx("devices --json", t.path);
  REQUIRE(dev.code == 0);
  const std::string bf16 = json::parse(dev.out).at("cpu").at("math_bfloat16").get<std::string>();
  INFO("devices: bfloat16 math " << bf16);
  const bool native = bf16.rfind("native bf16 (", 0) == 0;
  // bfloat16 on AVX512-BF16 without AMX: native for the passes and shapes the rule takes
  // (docs/precision.md): here both forward passes and the strided layer's data gradient.
  const bool per_shape = bf16.rfind("native bf16 per shape (", 0) == 0;
  CHECK((native || per_shape || bf16.rfind("widened to float32 (", 0) == 0));
  const Run dev_text = run_mpx("devices", t.path);
  CHECK(dev_text.out.find("  bfloat16 math " + bf16 + "\n") != std::string::npos);

  const Run r = run_mpx("bench --config c.yaml --set policy=mixed_bfloat16 --steps 1 --warmup 0 --json", t.path);
  REQUIRE(r.code == 0);
  const json m = json::parse(r.out).at("math16");
  REQUIRE(m.size() == 1);
  CHECK(m[0].at("dtype") == "bfloat16");
  // Per shape with bfloat16 dot products, the first layer's forward and weight gradient
  // (synthetic data: one channel) are mpx's few-channel kernels on them, which count as native
  // 16-bit math like oneDNN's native kernels (as they do with AMX, where the path is native);
  // the strided layer's weight gradient stays widened.
  const bool one_channel_dots =
      per_shape &&
      bf16.find("bfloat16 dot products in its few-channel forward for one input channel") != std::string::npos;
  // Both convolutions' forward and weight gradient, the second one's data gradient; the
  // float32 output layer is not a 16-bit op.
  const int want_native = native ? 5 : one_channel_dots ? 4 : per_shape ? 3 : 0;
  CHECK(m[0].at("native_ops").get<int>() + m[0].at("widened_ops").get<int>() == 5);
  CHECK(m[0].at("native_ops").get<int>() == want_native);
  CHECK(m[0].at("path") == (want_native == 5 ? "native" : want_native == 0 ? "widened" : "mixed"));
  CHECK(m[0].at("detail").get<std::string>().rfind(bf16, 0) == 0);
  const Run text = run_mpx("bench --config c.yaml --set policy=mixed_bfloat16 --steps 1 --warmup 0", t.path);
  REQUIRE(text.code == 0);
  CHECK(text.out.find("16-bit path  bfloat16: " + bf16) != std::string::npos);

  const Run f32 = run_mpx("bench --config c.yaml --steps 1 --warmup 0 --json", t.path);
  REQUIRE(f32.code == 0);
  CHECK(json::parse(f32.out).at("math16").empty());

  ::setenv("MPX_CPU_16BIT", "widen", 1);
  const Run w = run_mpx("bench --config c.yaml --set policy=mixed_bfloat16 --steps 1 --warmup 0 --json", t.path);
  const Run wdev = run_mpx("devices", t.path);
  ::setenv("MPX_CPU_16BIT", "fastest", 1);
  const Run bad = run_mpx("bench --config c.yaml --set policy=mixed_bfloat16 --steps 1 --warmup 0", t.path);
  ::unsetenv("MPX_CPU_16BIT");
  REQUIRE(w.code == 0);
  const json wj = json::parse(w.out);
  CHECK(wj.at("math16").at(0).at("path") == "widened");
  CHECK(wj.at("math16").at(0).at("detail") == "widened to float32 (MPX_CPU_16BIT=widen)");
  CHECK(wj.at("math16").at(0).at("widened_ops") == 5);
  for (const json& k : wj.at("kernels")) CHECK(k.at("op").get<std::string>().find("bfloat16") == std::string::npos);
  CHECK(wdev.out.find("  bfloat16 math widened to float32 (MPX_CPU_16BIT=widen)\n") != std::string::npos);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("MPX_CPU_16BIT='fastest'") != std::string::npos);
}

TEST_CASE("cpu.winograd in the config picks the kernels; MPX_CONV_WINOGRAD, when set, takes its place",
          "[cli][bench][config]") {
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "c.yaml", kConfig);
  auto first_forward = [&](const std::string& value) {
    const Run r = run_mpx("bench --config c.yaml --set cpu.winograd=" + value + " --steps 1 --warmup 0 --json", t.path);
    return impl_of(r, "convolution forward for x [8, 28, 28, 1], w [16, 3, 3, 1]");
  };
  CHECK(first_forward("on").rfind("winograd:F(4x4,3x3) ", 0) == 0);
  CHECK(first_forward("f2").rfind("winograd:F(2x2,3x3) ", 0) == 0);
  const std::string off = first_forward("off");
  CHECK(!off.empty());
  CHECK(off.find("winograd") == std::string::npos);
  CHECK(first_forward("auto").find("winograd") == std::string::npos);  // 1 input channel: not in the rule
  ::setenv("MPX_CONV_WINOGRAD", "off", 1);
  const std::string env_off = first_forward("on");
  ::unsetenv("MPX_CONV_WINOGRAD");
  CHECK(env_off.find("winograd") == std::string::npos);
  const Run bad = run_mpx("bench --config c.yaml --set cpu.winograd=fastest --steps 1 --warmup 0", t.path);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("cpu.winograd: expected one of auto | off | on | f2, got 'fastest'") != std::string::npos);
}

TEST_CASE("bench lists the layers whose forward runs in pieces of the batch; MPX_CPU_PIECES=off runs none, a bad "
          "value is exit 2",
          "[cli][bench]") {
  // The seed MNIST net's shape on the synthetic set: conv 3x3 (1 -> 32) valid, flatten, a float32
  // dense layer reading 26x26x32 = 21,632 inputs (docs/cpu-performance.md, "Pieces of the batch").
  support::TempDir t("mpx_cli_onednn");
  support::write_file(t.path / "seed.yaml",
                      "name: cli_pieces\n"
                      "seed: 5\n"
                      "device: cpu\n"
                      "data: {dataset: synthetic, batch_size: 40, train_limit: 80, test_limit: 8}\n"
                      "model:\n"
                      "  layers:\n"
                      "    - {type: conv2d, filters: 32, kernel: 3, activation: relu, name: conv}\n"
                      "    - {type: flatten, name: flat}\n"
                      "    - {type: dense, units: 10, activation: softmax, dtype: float32, name: out}\n");
  const std::string cmd = "bench --config seed.yaml --steps 1 --warmup 0";
  const Run on = run_mpx(cmd + " --json", t.path);
  const Run text = run_mpx(cmd, t.path);
  const Run bf16 = run_mpx(cmd + " --json --set policy=mixed_bfloat16", t.path);
  ::setenv("MPX_CPU_PIECES", "off", 1);
  const Run off = run_mpx(cmd + " --json", t.path);
  ::setenv("MPX_CPU_PIECES", "always", 1);
  const Run bad = run_mpx(cmd, t.path);
  ::unsetenv("MPX_CPU_PIECES");
  REQUIRE(on.code == 0);
  const std::string run = "conv -> flat -> out in pieces of 16 rows";
  CHECK(json::parse(on.out).at("pieces") == json::array({run}));
  // The pieces' shapes in the kernels list: 40 rows in pieces of 16, 16 and 8.
  CHECK(!impl_of(on, "convolution forward for x [16, 28, 28, 1], w [32, 3, 3, 1]").empty());
  CHECK(!impl_of(on, "convolution forward for x [8, 28, 28, 1], w [32, 3, 3, 1]").empty());
  CHECK(impl_of(on, "convolution forward for x [40, 28, 28, 1], w [32, 3, 3, 1]").empty());
  REQUIRE(text.code == 0);
  CHECK(text.out.find("\nforward      " + run + "\n") != std::string::npos);
  REQUIRE(bf16.code == 0);
  CHECK(json::parse(bf16.out).at("pieces").empty());  // a bfloat16 input: whole batches
  REQUIRE(off.code == 0);
  CHECK(json::parse(off.out).at("pieces").empty());
  CHECK(!impl_of(off, "convolution forward for x [40, 28, 28, 1], w [32, 3, 3, 1]").empty());
  CHECK(bad.code == 2);
  CHECK(bad.err.find("MPX_CPU_PIECES='always': expected auto, off or on") != std::string::npos);
}
