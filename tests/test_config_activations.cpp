// SPDX-License-Identifier: MIT
// lib/config and the activations: every name of core/activation.h loads on conv2d, dense
// and activation layers, swish is silu's alias, leaky_relu's negative_slope (default 0.2,
// Keras 3's activation function) round-trips, and the errors say what is wrong.
#include <catch2/catch.hpp>

#include <string>

#include "config/config.h"
#include "core/activation.h"
#include "core/error.h"

using namespace mpx;

namespace {

const std::string kPre = "data: {dataset: mnist}\nmodel:\n  layers:\n";

std::string error_of(const std::string& text) {
  try {
    parse_config(text, "x.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: every activation name loads on conv2d, dense and activation layers", "[config][activation]") {
  for (const ActivationEntry& a : kActivationNames) {
    const std::string name = a.name;
    INFO(name);
    const Config c = parse_config(kPre + "    - {type: conv2d, filters: 4, kernel: 3, activation: " + name +
                                      "}\n    - {type: activation, activation: " + name +
                                      "}\n    - {type: flatten}\n    - {type: dense, units: 10, activation: " +
                                      name + "}\n",
                                  "x.yaml");
    REQUIRE(c.model.layers.size() == 4);
    CHECK(enum_name(c.model.layers[0].activation) == name);
    CHECK(enum_name(c.model.layers[1].activation) == name);
    CHECK(enum_name(c.model.layers[3].activation) == name);
    CHECK(activation_kind(name) == a.kind);
  }
  CHECK(activation_kind("swish") == ActKind::Silu);
  CHECK(activation_kind("gelu") == ActKind::Gelu);
  CHECK(activation_kind("gelu_tanh") == ActKind::GeluTanh);
  CHECK(activation_kind("") == ActKind::None);
  CHECK_FALSE(activation_kind("softmax").has_value());  // the loss's, not a layer's
  CHECK_FALSE(activation_kind("elu").has_value());
}

TEST_CASE("config: leaky_relu's negative_slope defaults to 0.2 and round-trips", "[config][activation]") {
  const Config d = parse_config(kPre + "    - {type: dense, units: 10, activation: leaky_relu}\n", "x.yaml");
  CHECK(d.model.layers[0].negative_slope == 0.2);
  CHECK(static_cast<float>(d.model.layers[0].negative_slope) == kLeakyReluDefaultSlope);
  const Config c = parse_config(kPre +
                                    "    - {type: conv2d, filters: 4, activation: leaky_relu, negative_slope: 0.3}\n"
                                    "    - {type: activation, activation: leaky_relu, negative_slope: 0}\n"
                                    "    - {type: flatten}\n"
                                    "    - {type: dense, units: 10, activation: leaky_relu, negative_slope: 1.5}\n",
                                "x.yaml");
  CHECK(c.model.layers[0].negative_slope == 0.3);
  CHECK(c.model.layers[1].negative_slope == 0.0);
  CHECK(c.model.layers[3].negative_slope == 1.5);
  const std::string y = to_yaml(c);
  CHECK(y.find("negative_slope: 0.3") != std::string::npos);
  const Config r = parse_config(y, "resolved");
  CHECK(r.model.layers[0].negative_slope == 0.3);
  CHECK(r.model.layers[3].negative_slope == 1.5);
  CHECK(to_yaml(r) == y);
  // Other activations write no slope.
  const std::string g = to_yaml(parse_config(kPre + "    - {type: dense, units: 10, activation: gelu}\n", "x.yaml"));
  CHECK(g.find("negative_slope") == std::string::npos);
}

TEST_CASE("config: --set can switch an activation and its slope", "[config][activation]") {
  const Config c = parse_config(kPre + "    - {type: dense, units: 10, activation: relu}\n", "x.yaml",
                                {"model.layers[0].activation=leaky_relu", "model.layers[0].negative_slope=0.05"});
  CHECK(c.model.layers[0].activation == ActivationName::LeakyRelu);
  CHECK(c.model.layers[0].negative_slope == 0.05);
}

TEST_CASE("config: bad activation names get a 'did you mean', bad slopes a reason", "[config][activation]") {
  std::string all;  // core/activation.h's names, then softmax
  for (const ActivationEntry& a : kActivationNames) all += std::string(a.name) + " | ";
  all += "softmax";
  CHECK(error_of(kPre + "    - {type: dense, units: 3, activation: gleu}\n") ==
        "x.yaml:4:43: model.layers[0].activation: expected one of " + all + ", got 'gleu'; did you mean 'gelu'?");
  CHECK(error_of(kPre + "    - {type: activation, activation: swich}\n") ==
        "x.yaml:4:38: model.layers[0].activation: expected one of " + all + ", got 'swich'; did you mean 'swish'?");
  CHECK(error_of(kPre + "    - {type: conv2d, filters: 2, activation: leaky-relu}\n") ==
        "x.yaml:4:46: model.layers[0].activation: expected one of " + all +
            ", got 'leaky-relu'; did you mean 'leaky_relu'?");
  CHECK(error_of(kPre + "    - {type: dense, units: 3, activation: relu, negative_slope: 0.1}\n") ==
        "x.yaml:4:65: model.layers[0].negative_slope: negative_slope applies to activation leaky_relu only, not to "
        "relu");
  CHECK(error_of(kPre + "    - {type: dense, units: 3, negative_slope: 0.1}\n") ==
        "x.yaml:4:47: model.layers[0].negative_slope: negative_slope applies to activation leaky_relu only, not to "
        "linear");
  CHECK(error_of(kPre + "    - {type: dense, units: 3, activation: leaky_relu, negative_slope: -0.1}\n") ==
        "x.yaml:4:71: model.layers[0].negative_slope: expected a number >= 0, got -0.1");
  CHECK(error_of(kPre + "    - {type: max_pool, negative_slope: 0.1}\n").find("unknown key in a max_pool layer") !=
        std::string::npos);
}
