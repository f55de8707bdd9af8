// SPDX-License-Identifier: MIT
// Config -> resolved YAML (the run directory's config.yaml), driven by the
// schema (config/schema.h): every key with its value, defaults filled in,
// doubles in shortest round-trip form, so that parse_config(to_yaml(c)) gives
// back an equal Config. An optional key left unset is left out, with a comment
// on its section saying what unset means.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "config/config.h"
#include "config/schema.h"

namespace mpx {

namespace schema {

std::string yaml_double(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of("ni") != std::string::npos) return s;  // inf/nan never pass validation
  const size_t e = s.find('e');
  if (s.find('.') == std::string::npos) {
    if (e == std::string::npos)
      s += ".0";
    else
      s.insert(e, ".0");
  }
  return s;
}

void write_layers(YAML::Emitter& out, const std::vector<LayerConfig>& layers) {
  out << YAML::BeginSeq;
  for (const LayerConfig& given : layers) {
    LayerConfig L = given;
    apply_derived(L);
    out << YAML::BeginMap;
    for (const Key<LayerConfig>& k : layer_keys()) {
      if (!k.applies_to(L.type) || !k.value->is_set(L) || !k.applies_to_value(L)) continue;  // unset dtype: the model's policy
      out << YAML::Key << k.name() << YAML::Value;
      k.value->write(out, L);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

}  // namespace schema

namespace {

/// "mode unset: dynamic for mixed_float16, else none" for the unset keys directly in `m`.
std::string unset_note(const schema::MapNode& m, const Config& c) {
  std::string note;
  for (const auto& child : m.children)
    if (child.key != nullptr && !child.key->value->is_set(c))
      note += fmt::format("{}{} unset: {}", note.empty() ? "" : "; ", child.name, child.key->default_doc);
  return note;
}

void write_map(YAML::Emitter& out, const schema::MapNode& spec, const Config& c) {
  out << YAML::BeginMap;
  if (spec.path.empty())
    if (const std::string note = unset_note(spec, c); !note.empty()) out << YAML::Comment(note);
  for (const auto& child : spec.children) {
    if (child.map != nullptr) {
      out << YAML::Key << child.name;
      if (const std::string note = unset_note(*child.map, c); !note.empty()) out << YAML::Comment(note);
      out << YAML::Value;
      write_map(out, *child.map, c);
    } else if (child.key->value->is_set(c)) {
      out << YAML::Key << child.name << YAML::Value;
      child.key->value->write(out, c);
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string to_yaml(const Config& given) {
  Config c = given;
  schema::apply_derived(c);
  YAML::Emitter out;
  out.SetIndent(2);
  write_map(out, schema::config_tree(), c);
  return std::string(out.c_str()) + "\n";
}

}  // namespace mpx
