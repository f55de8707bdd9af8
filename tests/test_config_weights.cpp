// SPDX-License-Identifier: MIT
// lib/config: the `weights:` section (init_from): default, value, errors with
// file/line/column, --set, and the to_yaml round trip.
#include <catch2/catch.hpp>

#include "config/config.h"
#include "core/error.h"

using namespace mpx;

namespace {

const char* kMinimal =
    "data:\n"
    "  dataset: mnist\n"
    "model:\n"
    "  layers:\n"
    "    - {type: dense, units: 10}\n";

std::string with_section(const std::string& extra) { return std::string(kMinimal) + extra; }

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "x.yaml", overrides);
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config weights: init_from defaults to none and reads a path", "[config][weights]") {
  CHECK(parse_config(kMinimal, "x.yaml").weights.init_from.empty());
  CHECK(parse_config(with_section("weights:\n"), "x.yaml").weights.init_from.empty());
  CHECK(parse_config(with_section("weights: {init_from: ~}\n"), "x.yaml").weights.init_from.empty());
  const Config c = parse_config(with_section("weights:\n  init_from: runs/a/w.safetensors\n"), "x.yaml");
  CHECK(c.weights.init_from == "runs/a/w.safetensors");
  const Config d = parse_config(kMinimal, "x.yaml", {"weights.init_from=w.safetensors"});
  CHECK(d.weights.init_from == "w.safetensors");
}

TEST_CASE("config weights: errors name file, key, line and column", "[config][weights]") {
  CHECK(error_of(with_section("weights:\n  init_frm: w.safetensors\n")) ==
        "x.yaml:7:3: weights.init_frm: unknown key in the weights section; did you mean 'init_from'? (valid keys: "
        "init_from)");
  CHECK(error_of(with_section("weights:\n  init_from: [a, b]\n")) ==
        "x.yaml:7:14: weights.init_from: expected a non-empty string, got a list");
  CHECK(error_of(with_section("weights: 3\n")) == "x.yaml:6:10: weights: expected a mapping, got '3'");
  CHECK_THAT(error_of(with_section("weight:\n  init_from: w\n")),
             Catch::StartsWith("x.yaml:6:1: weight: unknown key in the top level; did you mean 'weights'?"));
}

TEST_CASE("config weights: to_yaml round-trips init_from, set or not", "[config][weights][to_yaml]") {
  for (const std::string& extra : {std::string(), std::string("weights: {init_from: 'a b: #c.safetensors'}\n")}) {
    const Config a = parse_config(with_section(extra), "x.yaml");
    const std::string y = to_yaml(a);
    INFO(y);
    CHECK_THAT(y, Catch::Contains("weights:\n  init_from: "));
    const Config b = parse_config(y, "y.yaml");
    CHECK(b.weights.init_from == a.weights.init_from);
    CHECK(to_yaml(b) == y);
  }
}
