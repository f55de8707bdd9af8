// SPDX-License-Identifier: MIT
// docs/config.md, generated from the schema tables (config/schema.h): one
// table per section and per layer type with each key's valid values, default
// and help line. `mpx config-reference` prints it; a test compares the file.
#include <fmt/format.h>

#include "config/config.h"
#include "config/schema.h"

namespace mpx {

namespace {

using schema::Key;
using schema::MapNode;

/// Text safe inside a Markdown table cell ('|' ends a cell, '<' may start HTML).
std::string cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|' || ch == '<') out += '\\';
    out += ch;
  }
  return out;
}

const char* kHeader = "| key | value | default | meaning |\n| --- | --- | --- | --- |\n";

template <class Owner>
std::string row(const std::string& shown_path, const Key<Owner>& k) {
  std::string name = "`" + shown_path + "`";
  if (!k.alias.empty()) name += " (or `" + k.alias + "`)";
  std::string def;
  if (k.required)
    def = "required";
  else if (!k.default_doc.empty())
    def = cell(k.default_doc);
  else
    def = "`" + k.value->show(Owner{}) + "`";
  return fmt::format("| {} | {} | {} | {} |\n", name, cell(k.value->expected()), def, cell(k.help));
}

/// Every key under `m`, depth first, with its full path.
void rows_under(const MapNode& m, std::string& out) {
  for (const auto& c : m.children) {
    if (c.map != nullptr)
      rows_under(*c.map, out);
    else
      out += row(c.key->path, *c.key);
  }
}

std::string config_sections() {
  const MapNode& root = schema::config_tree();
  std::string out = "## Top level\n\n";
  out += kHeader;
  for (const auto& c : root.children)
    if (c.key != nullptr) out += row(c.key->path, *c.key);
  for (const auto& c : root.children) {
    if (c.map == nullptr) continue;
    out += fmt::format("\n## `{}`\n\n", c.name);
    out += kHeader;
    rows_under(*c.map, out);
  }
  return out;
}

std::string layer_sections() {
  const uint32_t all = ~0u;
  std::string out =
      "\n## Layers\n\n"
      "Each entry of `model.layers` (and of a residual block's `layers`) is a mapping with a `type`.\n"
      "Keys of every layer type:\n\n";
  out += kHeader;
  for (const Key<LayerConfig>& k : schema::layer_keys())
    if (k.layer_types == all) out += row(k.path, k);
  for (LayerType t : enum_values<LayerType>()) {
    out += fmt::format("\n### `{}`\n\n", enum_name(t));
    std::string rows;
    for (const Key<LayerConfig>& k : schema::layer_keys())
      if (k.layer_types != all && k.applies_to(t)) rows += row(k.path, k);
    out += rows.empty() ? std::string("No other keys.\n") : kHeader + rows;
  }
  return out;
}

}  // namespace

std::string config_reference_markdown() {
  std::string out =
      "# Config reference\n\n"
      "<!-- Generated from lib/config/schema_table.cpp and layer_table.inc by `mpx config-reference > docs/config.md`;\n"
      "     do not edit by hand: tests/test_config_schema.cpp fails when this file and the schema differ. -->\n\n"
      "One YAML file describes a run (examples in configs/). Every key has a default except\n"
      "`data.dataset` and `model.layers`; an unknown key is an error that names the file, line,\n"
      "column and the closest valid key. `--set key.path=value` overrides any key\n"
      "(`--set optimizer.learning_rate=3e-3`, `--set model.layers[2].units=64`), and the run\n"
      "directory's `config.yaml` is the resolved file: every key with its value.\n\n"
      "mpx computes in float32, so every number must also fit one: 0, or a magnitude between\n"
      "1.17549435e-38 (the smallest normal float32) and 3.40282347e+38. The limits on what a\n"
      "config may hold (size, nesting, UTF-8) are in docs/inputs.md.\n\n"
      "## Paths\n\n"
      "A relative path written in a config file (`data.path`, `weights.init_from`) is relative to\n"
      "the folder of that file, not to the current folder. A relative path given with `--set`, and\n"
      "the default `data/<dataset>` when `data.path` is left out, are relative to the current\n"
      "folder (where data_scripts/ put the data sets; the shipped configs leave `data.path` out).\n"
      "The run directory's `config.yaml` records every path absolute, so `mpx eval --checkpoint\n"
      "RUN` and `--resume RUN` work from any folder.\n\n";
  return out + config_sections() + layer_sections();
}

}  // namespace mpx
