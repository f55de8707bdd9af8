// SPDX-License-Identifier: MIT
// Key-by-key differences of two resolved configs (config.h), read from their
// resolved YAML so that every key the schema writes is compared.
#include <yaml-cpp/yaml.h>

#include <set>

#include "config/config_diff.h"

namespace mpx {

namespace {

std::string flow(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "~";
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << n;
  return out.c_str();
}

void walk(const YAML::Node& a, const YAML::Node& b, const std::string& path, std::vector<ConfigDifference>& out) {
  const bool maps = a.IsDefined() && b.IsDefined() && a.IsMap() && b.IsMap();
  const bool seqs_of_maps = a.IsDefined() && b.IsDefined() && a.IsSequence() && b.IsSequence() &&
                            a.size() == b.size() && a.size() > 0 && a[0].IsMap() && b[0].IsMap();
  if (maps) {
    std::vector<std::string> keys;
    std::set<std::string> seen;
    for (const YAML::Node* m : {&a, &b})
      for (const auto& kv : *m)
        if (seen.insert(kv.first.Scalar()).second) keys.push_back(kv.first.Scalar());
    for (const std::string& k : keys) walk(a[k], b[k], path.empty() ? k : path + "." + k, out);
    return;
  }
  if (seqs_of_maps) {
    for (size_t i = 0; i < a.size(); ++i) walk(a[i], b[i], path + "[" + std::to_string(i) + "]", out);
    return;
  }
  const std::string va = flow(a), vb = flow(b);
  if (va != vb) out.push_back({path, va, vb});
}

}  // namespace

std::vector<ConfigDifference> config_differences(const Config& a, const Config& b) {
  std::vector<ConfigDifference> out;
  walk(YAML::Load(to_yaml(a)), YAML::Load(to_yaml(b)), "", out);
  return out;
}

}  // namespace mpx
