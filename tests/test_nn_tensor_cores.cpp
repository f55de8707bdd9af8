// SPDX-License-Identifier: MIT
// tensor_core_warnings() (`mpx validate` on a GPU config): 16-bit conv2d /
// dense layers whose channels, units or batch are not multiples of 8, the first
// conv on RGB input called expected, float32 layers (policy or per-layer dtype)
// never reported, and the GPU generation (no Tensor Cores below cc 7.0, no bfloat16
// ones below 8.0). Needs no GPU: the compute capability is a parameter.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/model.h"
#include "nn/tensor_cores.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;
using support::model_config;
using support::residual_layer;

namespace {

LayerConfig named(LayerConfig l, const std::string& name, std::optional<LayerDType> dtype = std::nullopt) {
  l.name = name;
  l.dtype = dtype;
  return l;
}

std::vector<std::string> warnings(std::vector<LayerConfig> layers, Policy p, int cc, int64_t batch = 64, int C = 3) {
  auto be = create_backend("cpu");
  Model m(model_config(std::move(layers)), p, *be, 16, 16, C, 10, batch);
  return tensor_core_warnings(m, batch, cc);
}

/// The reference CIFAR net of the configs (float32 output layer).
std::vector<LayerConfig> cifar_net() {
  return {named(conv_layer(64, 3, 1, Padding::Same, ActivationName::Relu), "c1"),
          named(conv_layer(128, 3, 1, Padding::Same, ActivationName::Relu), "c2"),
          named(make_layer(LayerType::GlobalAvgPool), "gap"), named(dense_layer(256, ActivationName::Relu), "fc"),
          named(dense_layer(10), "predictions", LayerDType::Float32)};
}

bool has(const std::vector<std::string>& w, const std::string& a, const std::string& b = "") {
  for (const auto& s : w)
    if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& w) {
  std::string s;
  for (const auto& x : w) s += x + "\n";
  return s;
}

}  // namespace

TEST_CASE("tensor core warnings: the reference CIFAR net only has the expected first conv", "[nn][tensor_cores]") {
  const auto w = warnings(cifar_net(), Policy::MixedBFloat16, 80);
  INFO(joined(w));
  REQUIRE(w.size() == 1);
  CHECK(has(w, "conv2d 'c1': 3 input channels (not a multiple of 8)", "under mixed_bfloat16"));
  CHECK(has(w, "expected for the first layer"));
  // Float32: nothing at all.
  CHECK(warnings(cifar_net(), Policy::Float32, 80).empty());
  // 8-channel input: nothing either.
  CHECK(warnings(cifar_net(), Policy::MixedFloat16, 90, 64, 8).empty());
}

TEST_CASE("tensor core warnings: filters, input channels, units, input features and batch", "[nn][tensor_cores]") {
  std::vector<LayerConfig> net = {named(conv_layer(60, 3, 1, Padding::Same, ActivationName::Relu), "c1"),
                                  named(conv_layer(128, 3, 1, Padding::Same, ActivationName::Relu), "c2"),
                                  named(make_layer(LayerType::GlobalAvgPool), "gap"),
                                  named(dense_layer(100, ActivationName::Relu), "fc"),
                                  named(dense_layer(10), "predictions")};
  const auto w = warnings(net, Policy::MixedFloat16, 80, 100);
  INFO(joined(w));
  CHECK(has(w, "conv2d 'c1': 60 filters (not a multiple of 8)", "use filters: 64"));
  CHECK(has(w, "conv2d 'c2': 60 input channels (not a multiple of 8)", "under mixed_float16"));
  CHECK(has(w, "dense 'fc': 100 units", "use units: 104"));
  CHECK(has(w, "dense 'predictions': 100 input features"));
  CHECK(has(w, "dense 'predictions': 10 units", "output layer"));
  CHECK(has(w, "batch size 100 (not a multiple of 8)", "data.batch_size: 104 or 96"));
  CHECK(w.size() == 7);  // + the RGB first conv

  SECTION("a per-layer float32 dtype suppresses the layer's warnings") {
    net[0].dtype = LayerDType::Float32;
    net[4].dtype = LayerDType::Float32;
    const auto v = warnings(net, Policy::MixedFloat16, 80, 100);
    INFO(joined(v));
    CHECK_FALSE(has(v, "'c1'"));
    CHECK_FALSE(has(v, "'predictions'"));
    CHECK(has(v, "conv2d 'c2': 60 input channels"));  // c2 still computes in float16
    CHECK(has(v, "dense 'fc': 100 units"));
  }
  SECTION("a 16-bit layer under policy float32 is reported with its dtype") {
    for (auto& l : net) l.dtype = std::nullopt;
    net[1].dtype = LayerDType::BFloat16;
    const auto v = warnings(net, Policy::Float32, 80, 64);
    INFO(joined(v));
    REQUIRE(v.size() == 1);
    CHECK(has(v, "conv2d 'c2': 60 input channels", "as bfloat16 (its dtype)"));
  }
}

TEST_CASE("tensor core warnings: residual projections are checked too", "[nn][tensor_cores]") {
  std::vector<LayerConfig> net = {
      named(conv_layer(16, 3, 1, Padding::Same, ActivationName::Relu), "c1"),
      named(residual_layer({named(conv_layer(12, 3, 2, Padding::Same, ActivationName::Relu), "r1")}), "res"),
      named(make_layer(LayerType::GlobalAvgPool), "gap"), named(dense_layer(10), "out", LayerDType::Float32)};
  const auto w = warnings(net, Policy::MixedBFloat16, 90);
  INFO(joined(w));
  CHECK(has(w, "conv2d 'r1': 12 filters"));
  CHECK(has(w, "conv2d 'res_projection': 12 filters"));
}

TEST_CASE("tensor core warnings: the GPU generation", "[nn][tensor_cores]") {
  SECTION("cc 6.1: no Tensor Cores, one line and nothing per layer") {
    const auto w = warnings(cifar_net(), Policy::MixedFloat16, 61);
    INFO(joined(w));
    REQUIRE(w.size() == 1);
    CHECK(has(w, "policy mixed_float16", "compute capability 6.1"));
    CHECK(has(w, "no Tensor Cores", "policy: float32"));
  }
  SECTION("cc 8.0: per layer only") {
    const auto w = warnings(cifar_net(), Policy::MixedFloat16, 80);
    INFO(joined(w));
    CHECK_FALSE(has(w, "no Tensor Cores"));
    CHECK(has(w, "conv2d 'c1'"));
  }
  SECTION("cc 7.5 with bfloat16: no bfloat16 Tensor Cores") {
    const auto w = warnings(cifar_net(), Policy::MixedBFloat16, 75);
    INFO(joined(w));
    REQUIRE(w.size() == 1);
    CHECK(has(w, "no bfloat16 Tensor Cores", "mixed_float16"));
  }
  SECTION("unknown GPU (cc 0): the shapes only") {
    const auto w = warnings(cifar_net(), Policy::MixedBFloat16, 0);
    REQUIRE(w.size() == 1);
    CHECK(has(w, "conv2d 'c1'"));
  }
  SECTION("float32 on an old GPU: nothing") { CHECK(warnings(cifar_net(), Policy::Float32, 61).empty()); }
}
