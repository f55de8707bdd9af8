// SPDX-License-Identifier: MIT
// What the schema's users share: the tree of mappings derived from the dotted
// key paths, the valid-key lists, derived defaults, and layer equality.
#include "config/schema.h"

namespace mpx::schema {

namespace {

MapNode* child_map(MapNode& parent, const std::string& name) {
  for (auto& c : parent.children)
    if (c.map != nullptr && c.name == name) return const_cast<MapNode*>(c.map);
  parent.owned.push_back(std::make_unique<MapNode>());
  MapNode* m = parent.owned.back().get();
  m->path = parent.path.empty() ? name : parent.path + "." + name;
  parent.children.push_back({name, nullptr, m});
  return m;
}

std::unique_ptr<MapNode> build_tree() {
  auto root = std::make_unique<MapNode>();
  for (const Key<Config>& k : config_keys()) {
    MapNode* at = root.get();
    size_t from = 0;
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', from)) {
      at = child_map(*at, k.path.substr(from, dot - from));
      from = dot + 1;
    }
    at->children.push_back({k.path.substr(from), &k, nullptr});
  }
  return root;
}

}  // namespace

std::vector<std::string> MapNode::allowed() const {
  std::vector<std::string> out;
  for (const Child& c : children) {
    out.push_back(c.name);
    if (c.key != nullptr && !c.key->alias.empty()) out.push_back(c.key->alias);
  }
  return out;
}

std::string MapNode::what() const {
  if (path.empty()) return "the top level";
  if (path.find('.') == std::string::npos) return "the " + path + " section";
  return path;
}

const MapNode& config_tree() {
  static const std::unique_ptr<MapNode> tree = build_tree();
  return *tree;
}

std::vector<std::string> layer_allowed_keys(LayerType t) {
  std::vector<std::string> out;
  for (const Key<LayerConfig>& k : layer_keys()) {
    if (!k.applies_to(t)) continue;
    out.push_back(k.path);
    if (!k.alias.empty()) out.push_back(k.alias);
  }
  return out;
}

void apply_derived(Config& c) {
  for (const Key<Config>& k : config_keys())
    if (k.derive != nullptr && k.is_initial(c)) k.derive(c);
}

void apply_derived(LayerConfig& l) {
  for (const Key<LayerConfig>& k : layer_keys())
    if (k.derive != nullptr && k.applies_to(l.type) && k.is_initial(l)) k.derive(l);
}

bool layers_equal(const std::vector<LayerConfig>& a, const std::vector<LayerConfig>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].type != b[i].type) return false;
    for (const Key<LayerConfig>& k : layer_keys())
      if (k.applies_to(a[i].type) && !k.value->equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace mpx::schema
