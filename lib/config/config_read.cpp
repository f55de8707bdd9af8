// SPDX-License-Identifier: MIT
// YAML tree -> validated Config, driven by the schema (config/schema.h): every
// mapping first rejects unknown keys (with the closest valid one), then each
// key of the table is read by its value type, which checks type and range and
// names file, key path, line and column on failure.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "config/config.h"
#include "config/schema.h"
#include "config/yaml_tree.h"
#include "core/error.h"
#include "core/input_file.h"

namespace mpx {

using config_detail::MapView;
using schema::Key;
using schema::Origin;
using schema::Reader;
using schema::YNode;

namespace {

/// Reads one key (or its alias; both present is an error) when present; a
/// required key that is missing is an error saying what it expects.
template <class Owner>
void read_key(const Reader& r, const MapView& m, const Key<Owner>& k, Owner& o) {
  const std::string name = k.name();
  const YNode* n = m.get(name);
  std::string path = m.child_path(name);
  if (!k.alias.empty()) {
    if (const YNode* na = m.get(k.alias)) {
      if (n != nullptr)
        r.fail(na->origin, m.child_path(k.alias),
               fmt::format("'{}' and '{}' are the same key; give only one", name, k.alias));
      n = na;
      path = m.child_path(k.alias);
    }
  }
  if (k.required) n = &r.require(m, name, k.value->expected());
  if (n != nullptr) k.value->read(r, *n, path, o);
}

void read_map(const Reader& r, const schema::MapNode& spec, const YNode* n, const Origin& parent_origin, Config& c) {
  const MapView m = r.section(n, spec.path, spec.what(), spec.allowed(), parent_origin);
  for (const auto& child : spec.children) {
    if (child.map != nullptr)
      read_map(r, *child.map, m.get(child.name), m.origin, c);
    else
      read_key(r, m, *child.key, c);
  }
  for (const schema::MapCheck& mc : schema::map_checks())
    if (mc.path == spec.path) mc.check(r, m.origin, spec.path, c);
}

const Key<LayerConfig>& layer_type_key() {
  for (const auto& k : schema::layer_keys())
    if (k.path == "type") return k;
  throw Error("the layer schema has no 'type' key");
}

LayerConfig read_layer(const Reader& r, const YNode& n, const std::string& path) {
  LayerConfig L;
  L.key_path = path;
  L.line = n.origin.line;
  L.column = n.origin.column;
  if (!n.is_map())
    r.fail(n.origin, path,
           fmt::format("expected a layer (a mapping with a 'type' key, e.g. {{type: dense, units: 10}}), got {}",
                       config_detail::describe(n)));
  const Key<LayerConfig>& type = layer_type_key();
  const YNode* tn = n.find("type");
  if (tn == nullptr || tn->is_null())
    r.fail(n.origin, path + ".type", fmt::format("required key is missing ({})", type.value->expected()));
  type.value->read(r, *tn, path + ".type", L);
  const MapView m =
      r.section(&n, path, fmt::format("a {} layer", enum_name(L.type)), schema::layer_allowed_keys(L.type), n.origin);
  for (const Key<LayerConfig>& k : schema::layer_keys())
    if (&k != &type && k.applies_to(L.type)) read_key(r, m, k, L);
  for (const Key<LayerConfig>& k : schema::layer_keys())
    if (const YNode* v = m.get(k.name()); v != nullptr && k.applies_to(L.type) && !k.applies_to_value(L))
      r.fail(v->origin, m.child_path(k.name()), k.applies(L));
  schema::apply_derived(L);
  return L;
}

Config build(const YNode& root, const std::string& source) {
  const Reader r(source);
  Config c;
  c.source = source;
  if (!root.is_null() && !root.is_map())
    r.fail(root.origin, "config",
           fmt::format("expected a mapping of sections at the top level, got {}", config_detail::describe(root)));
  read_map(r, schema::config_tree(), &root, Origin{}, c);
  schema::apply_derived(c);
  return c;
}

}  // namespace

namespace schema {

void read_layers(const Reader& r, const YNode& seq, const std::string& path, std::vector<LayerConfig>& out) {
  if (!seq.is_seq() || seq.children.empty())
    r.fail(seq.origin, path,
           fmt::format("expected a non-empty list of layers, got {}",
                       seq.is_seq() ? "an empty list" : config_detail::describe(seq)));
  out.clear();
  for (size_t i = 0; i < seq.children.size(); ++i)
    out.push_back(read_layer(r, seq.children[i], fmt::format("{}[{}]", path, i)));
}

}  // namespace schema

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  size_t nodes = 0;  // one budget for the file and its --set values
  YNode root = config_detail::parse_yaml_tree(yaml_text, source, "", &nodes);
  for (const auto& ov : overrides) config_detail::apply_override(root, ov, source, &nodes);
  return build(root, source);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  using config_detail::kMaxConfigBytes;
  // Opened without blocking: a FIFO that no process writes to is refused at once instead of
  // hanging in open() (docs/inputs.md, "Files that are not regular files").
  InputFile in(path);
  if (!in.ok()) throw ConfigError(fmt::format("{}: cannot open config file: {}", path, in.error()));
  if (!in.regular() && !in.fifo() && !in.char_device())
    throw ConfigError(fmt::format("{}: cannot read config file: it is {}", path, in.kind()));
  if (in.fifo() && in.fifo_without_writer())
    throw ConfigError(fmt::format("{}: the config is {} that no process is writing to, so there is nothing to "
                                  "read; give a regular file, or write the config into the pipe",
                                  path, in.kind()));
  const auto too_big = [&](const std::string& size) {
    return ConfigError(fmt::format("{}: the config file is larger than the limit of {} bytes (1 MiB){}; "
                                   "is it the right file?",
                                   path, kMaxConfigBytes, size));
  };
  // A regular file is judged by its size before a byte is read; anything else
  // (a pipe, /dev/zero) is read only up to one byte past the limit.
  if (in.regular() && in.size() > kMaxConfigBytes) throw too_big(fmt::format(": it has {} bytes", in.size()));
  std::string text(kMaxConfigBytes + 1, '\0');
  const int64_t got = in.read(text.data(), text.size());
  if (got < 0) throw ConfigError(fmt::format("{}: cannot read config file: {}", path, std::strerror(errno)));
  text.resize(static_cast<size_t>(got));
  if (text.size() > kMaxConfigBytes) throw too_big("");
  return parse_config(text, path, overrides);
}

}  // namespace mpx
