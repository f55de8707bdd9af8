// SPDX-License-Identifier: MIT
// The config schema (lib/config/schema_table.cpp) as the one description of
// every key: a round trip that sets every key of the table to a non-default
// value and compares the struct fields read back, every key present in
// to_yaml's output, docs/config.md equal to the generated reference, the
// enum name tables, and the keys that replaced environment variables.
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/schema.h"
#include "core/error.h"

using namespace mpx;

namespace {

/// A Config with every key of the schema set to a valid non-default value:
/// each top-level key varied through its own entry, and model.layers one layer
/// of every type with each of its type's keys varied. `visited` counts the
/// distinct entries used (config keys, then layer keys).
struct Varied {
  Config c;
  size_t config_keys_visited = 0;
  std::set<const schema::Key<LayerConfig>*> layer_keys_visited;
};

Varied vary_everything() {
  Varied v;
  int salt = 0;
  for (const auto& k : schema::config_keys()) {
    k.value->vary(v.c, ++salt);
    ++v.config_keys_visited;
  }
  std::vector<LayerConfig> layers;
  for (LayerType t : enum_values<LayerType>()) {
    LayerConfig L;
    for (const auto& k : schema::layer_keys()) {
      if (!k.applies_to(t)) continue;
      if (k.path == "type") {
        L.type = t;  // every value of the type key, one layer each
      } else {
        if (k.enable) k.enable(L);  // a key that applies only with another key's value
        k.value->vary(L, ++salt);
      }
      v.layer_keys_visited.insert(&k);
    }
    layers.push_back(L);
  }
  v.c.model.layers = layers;
  return v;
}

/// `dotted` ("data.augment.horizontal_flip") names a key of the YAML mapping `n`.
bool has_path(const YAML::Node& n, const std::string& dotted) {
  const size_t dot = dotted.find('.');
  const std::string head = dotted.substr(0, dot);
  if (!n.IsMap() || !n[head]) return false;
  return dot == std::string::npos || has_path(n[head], dotted.substr(dot + 1));
}

}  // namespace

TEST_CASE("schema: every key set to a non-default value comes back from to_yaml + parse_config", "[config][schema]") {
  const Varied v = vary_everything();
  // Every entry of both tables was visited: a new key is covered without touching this test.
  CHECK(v.config_keys_visited == schema::config_keys().size());
  CHECK(v.layer_keys_visited.size() == schema::layer_keys().size());

  const Config initial;
  for (const auto& k : schema::config_keys()) {
    INFO(k.path);
    if (k.path != "model.layers") CHECK_FALSE(k.value->equal(v.c, initial));  // really not the default
  }

  const std::string y = to_yaml(v.c);
  INFO(y);
  const Config back = parse_config(y, "varied.yaml");
  for (const auto& k : schema::config_keys()) {
    INFO(k.path << ": set " << k.value->show(v.c) << ", read back " << k.value->show(back));
    CHECK(k.value->equal(v.c, back));
  }
  REQUIRE(back.model.layers.size() == v.c.model.layers.size());
  for (size_t i = 0; i < back.model.layers.size(); ++i) {
    const LayerConfig& a = v.c.model.layers[i];
    const LayerConfig& b = back.model.layers[i];
    const LayerConfig none;
    CHECK(a.type == b.type);
    for (const auto& k : schema::layer_keys()) {
      if (!k.applies_to(a.type)) continue;
      INFO(enum_name(a.type) << "." << k.path << ": set " << k.value->show(a) << ", read back " << k.value->show(b));
      if (k.path != "type") CHECK_FALSE(k.value->equal(a, none));
      CHECK(k.value->equal(a, b));
    }
  }
}

TEST_CASE("schema: to_yaml writes every key of the table", "[config][schema]") {
  const Varied v = vary_everything();
  const YAML::Node doc = YAML::Load(to_yaml(v.c));
  size_t written = 0;
  for (const auto& k : schema::config_keys()) {
    INFO(k.path);
    CHECK(has_path(doc, k.path));
    ++written;
  }
  CHECK(written == schema::config_keys().size());

  std::set<std::string> layer_written;
  const YAML::Node layers = doc["model"]["layers"];
  REQUIRE(layers.size() == v.c.model.layers.size());
  for (size_t i = 0; i < layers.size(); ++i)
    for (const auto& k : schema::layer_keys()) {
      if (!k.applies_to(v.c.model.layers[i].type)) continue;
      INFO(enum_name(v.c.model.layers[i].type) << "." << k.path);
      CHECK(layers[i][k.name()].IsDefined());
      layer_written.insert(k.path);
    }
  for (const auto& k : schema::layer_keys()) CHECK(layer_written.count(k.path) == 1);
}

TEST_CASE("schema: every entry has a help line and a distinct path", "[config][schema]") {
  std::set<std::string> paths;
  for (const auto& k : schema::config_keys()) {
    INFO(k.path);
    CHECK_FALSE(k.help.empty());
    CHECK(paths.insert(k.path).second);
  }
  for (LayerType t : enum_values<LayerType>()) {
    std::set<std::string> names;
    for (const auto& k : schema::layer_keys()) {
      if (!k.applies_to(t)) continue;
      INFO(enum_name(t) << "." << k.path);
      CHECK_FALSE(k.help.empty());
      CHECK(names.insert(k.path).second);  // one meaning per key and type
    }
  }
}

TEST_CASE("schema: docs/config.md is the generated reference", "[config][schema][docs]") {
  const std::filesystem::path doc = std::filesystem::path(MPX_SOURCE_DIR) / "docs" / "config.md";
  std::ifstream in(doc);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string want = config_reference_markdown();
  INFO("docs/config.md is stale: regenerate it with `mpx config-reference > docs/config.md`");
  CHECK(ss.str() == want);
  for (const auto& k : schema::config_keys()) CHECK_THAT(want, Catch::Contains("`" + k.path + "`"));
  for (const auto& k : schema::layer_keys()) CHECK_THAT(want, Catch::Contains("`" + k.path + "`"));
}

TEST_CASE("schema: enum names round-trip through their one table", "[config][schema]") {
  CHECK(enum_names<ActivationName>() == std::vector<std::string>{"linear", "relu", "leaky_relu", "gelu", "gelu_tanh",
                                                                "silu", "swish", "softmax"});
  for (LayerType t : enum_values<LayerType>()) CHECK(parse_enum<LayerType>(enum_name(t)) == t);
  for (OptimizerName o : enum_values<OptimizerName>()) CHECK(parse_enum<OptimizerName>(enum_name(o)) == o);
  CHECK(parse_enum<ScheduleName>("reduce_on_plateau") == ScheduleName::ReduceOnPlateau);
  CHECK(parse_enum<SyncMode>("log") == SyncMode::Log);
  CHECK(parse_enum<DatasetName>("fashion_mnist") == DatasetName::FashionMnist);
  CHECK_FALSE(parse_enum<Padding>("full").has_value());
  CHECK(std::string(enum_name(LayerDType::BFloat16)) == "bfloat16");
}

TEST_CASE("schema: dist and cuda keys (defaults, ranges, values)", "[config][schema]") {
  const std::string base = "data: {dataset: mnist}\nmodel: {layers: [{type: dense, units: 10}]}\n";
  const Config d = parse_config(base, "x.yaml");
  CHECK(d.dist.overlap_allreduce == OverlapMode::Auto);
  CHECK(d.dist.bucket_bytes == 4194304);
  CHECK(d.cuda.workspace_mb == 512);

  const Config c =
      parse_config(base + "dist: {overlap_allreduce: off, bucket_bytes: 65536}\ncuda: {workspace_mb: 0}\n", "x.yaml");
  CHECK(c.dist.overlap_allreduce == OverlapMode::Off);
  CHECK(c.dist.bucket_bytes == 65536);
  CHECK(c.cuda.workspace_mb == 0);
  CHECK(parse_config(base, "x.yaml", {"dist.overlap_allreduce=on"}).dist.overlap_allreduce == OverlapMode::On);
  const Config r = parse_config(to_yaml(c), "y.yaml");
  CHECK(r.dist.overlap_allreduce == OverlapMode::Off);

  auto error_of = [&](const std::string& extra) {
    try {
      parse_config(base + extra, "x.yaml");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of("dist: {bucket_bytes: 2}\n") == "x.yaml:3:22: dist.bucket_bytes: expected an integer >= 4, got 2");
  CHECK(error_of("cuda: {workspace_mb: -1}\n") == "x.yaml:3:22: cuda.workspace_mb: expected an integer in [0, 1048576], got -1");
  CHECK(error_of("dist: {overlap_allreduce: always}\n") ==
        "x.yaml:3:27: dist.overlap_allreduce: expected one of auto | on | off, got 'always'");
  CHECK(error_of("cuda: {workspace: 1}\n") ==
        "x.yaml:3:8: cuda.workspace: unknown key in the cuda section; did you mean 'workspace_mb'? (valid keys: "
        "workspace_mb, conv_algo, deterministic)");
}

TEST_CASE("schema: cuda.conv_algo and cuda.deterministic (defaults: heuristic, false)", "[config][schema]") {
  const std::string base = "data: {dataset: mnist}\nmodel: {layers: [{type: dense, units: 10}]}\n";
  const Config d = parse_config(base, "x.yaml");
  CHECK(d.cuda.conv_algo == ConvAlgo::Heuristic);
  CHECK_FALSE(d.cuda.deterministic);
  const Config c = parse_config(base + "cuda: {conv_algo: search, deterministic: true}\n", "x.yaml");
  CHECK(c.cuda.conv_algo == ConvAlgo::Search);
  CHECK(c.cuda.deterministic);
  const Config r = parse_config(to_yaml(c), "y.yaml");  // the resolved config.yaml keeps them
  CHECK(r.cuda.conv_algo == ConvAlgo::Search);
  CHECK(r.cuda.deterministic);
  CHECK(parse_config(base, "x.yaml", {"cuda.conv_algo=heuristic"}).cuda.conv_algo == ConvAlgo::Heuristic);
  try {
    parse_config(base + "cuda: {conv_algo: fastest}\n", "x.yaml");
    FAIL("conv_algo: fastest was accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) == "x.yaml:3:19: cuda.conv_algo: expected one of heuristic | search, got 'fastest'");
  }
}
