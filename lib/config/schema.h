// SPDX-License-Identifier: MIT
// The config schema: every key written ONCE, as an entry of the tables in
// config/schema_table.cpp (path, value type with its range or allowed values,
// help line, options). The tables drive the reader (config_read.cpp), the
// unknown-key check and its valid-key lists, the writer (config_yaml_out.cpp),
// docs/config.md (config_doc.cpp) and the round-trip test. The default of a
// key is its member initializer in config/config.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/reader.h"

namespace YAML {
class Emitter;
}

namespace mpx::schema {

using config_detail::Origin;
using config_detail::Reader;
using config_detail::YNode;

/// How one key's value is read, written, compared and described; the value
/// types of config/schema_values.h implement it over one field (or two: [h, w]).
template <class Owner>
class Value {
 public:
  virtual ~Value() = default;
  /// Reads `n` into the field: type and range checked, errors name `path`.
  virtual void read(const Reader& r, const YNode& n, const std::string& path, Owner& o) const = 0;
  /// Emits the value (only called when is_set).
  virtual void write(YAML::Emitter& out, const Owner& o) const = 0;
  /// false: an optional key left unset; the writer leaves it out.
  virtual bool is_set(const Owner&) const { return true; }
  virtual bool equal(const Owner& a, const Owner& b) const = 0;
  /// The value as one line of YAML ("42", "[3, 5]", "same").
  virtual std::string show(const Owner& o) const = 0;
  /// What is valid: "a positive integer", "one of same | valid" (docs, required-key messages).
  virtual std::string expected() const = 0;
  /// Sets a valid value that differs from the default; different `salt`s give
  /// different values where the type has room (the round-trip test).
  virtual void vary(Owner& o, int salt) const = 0;
};

/// One key of the schema. Built with schema::key(...) and the options below.
template <class Owner>
struct Key {
  std::string path;  // dotted from the owner: "data.augment.horizontal_flip"; a layer key: "filters"
  std::string help;  // one line for docs/config.md
  std::shared_ptr<const Value<Owner>> value;
  bool required = false;
  std::string alias;        // another spelling of the key ("stride" for "strides")
  std::string default_doc;  // the default in words, when it is not the field's initial value
  /// Fills the field from other keys when it is still at its initial value
  /// after reading (and before writing): a derived default.
  void (*derive)(Owner&) = nullptr;
  uint32_t layer_types = ~0u;  // layer keys: a bit per LayerType that has the key
  /// A key that applies only with another key's value (negative_slope: leaky_relu only):
  /// "" when it applies to `o`, else why not. Given where it does not apply it is an error;
  /// where it does not apply the writer leaves it out. `enable` makes it apply (tests).
  std::string (*applies)(const Owner&) = nullptr;
  void (*enable)(Owner&) = nullptr;

  /// The last path component (the key as written in its mapping).
  std::string name() const { return path.substr(path.rfind('.') + 1); }
  bool applies_to(LayerType t) const { return (layer_types >> static_cast<int>(t)) & 1u; }
  /// Still at the initial value of a default-constructed owner.
  bool is_initial(const Owner& o) const { return value->equal(o, Owner{}); }

  Key&& req() && {
    required = true;
    return std::move(*this);
  }
  Key&& aka(std::string a) && {
    alias = std::move(a);
    return std::move(*this);
  }
  Key&& doc_default(std::string d) && {
    default_doc = std::move(d);
    return std::move(*this);
  }
  Key&& derived(void (*f)(Owner&), std::string d) && {
    derive = f;
    default_doc = std::move(d);
    return std::move(*this);
  }
  Key&& only_if(std::string (*why_not)(const Owner&), void (*make_apply)(Owner&)) && {
    applies = why_not;
    enable = make_apply;
    return std::move(*this);
  }
  /// Written and accepted for `o` (see only_if).
  bool applies_to_value(const Owner& o) const { return applies == nullptr || applies(o).empty(); }
  Key&& only(std::initializer_list<LayerType> types) && {
    layer_types = 0;
    for (LayerType t : types) layer_types |= 1u << static_cast<int>(t);
    return std::move(*this);
  }
  /// A key of the types in `mask` (a bit per LayerType, as layer_types_sharing gives).
  Key&& only_types(uint32_t mask) && {
    layer_types = mask;
    return std::move(*this);
  }
};

/// A check over one mapping once all its keys are read, e.g. data.normalize:
/// mean and std of the same length. Runs whether or not the mapping is present.
struct MapCheck {
  std::string path;
  void (*check)(const Reader& r, const Origin& at, const std::string& path, Config& c);
};

/// The tables (config/schema_table.cpp), in the order of the YAML and the docs.
const std::vector<Key<Config>>& config_keys();
const std::vector<Key<LayerConfig>>& layer_keys();
const std::vector<MapCheck>& map_checks();

/// One mapping of the config (the top level, "data", "data.normalize"),
/// derived from the dotted key paths; children in first-appearance order.
struct MapNode {
  struct Child {
    std::string name;
    const Key<Config>* key = nullptr;  // a key, or
    const MapNode* map = nullptr;      // a nested mapping
  };
  std::string path;
  std::vector<Child> children;
  std::vector<std::unique_ptr<MapNode>> owned;

  /// The valid keys, each alias right after its key.
  std::vector<std::string> allowed() const;
  /// How messages name it: "the top level", "the data section", "data.normalize".
  std::string what() const;
};
const MapNode& config_tree();

/// The keys a layer of type `t` accepts, each alias right after its key.
std::vector<std::string> layer_allowed_keys(LayerType t);
/// Applies the derived defaults of the keys that apply (config: every key; a layer: its type's).
void apply_derived(Config& c);
void apply_derived(LayerConfig& l);

// The value type of a list of layers reads, writes and compares through these.
void read_layers(const Reader& r, const YNode& seq, const std::string& path, std::vector<LayerConfig>& out);
void write_layers(YAML::Emitter& out, const std::vector<LayerConfig>& layers);
/// Every key of the layer's type equal (and the nested layers' too).
bool layers_equal(const std::vector<LayerConfig>& a, const std::vector<LayerConfig>& b);
/// Shortest representation that reads back to the same double, always with a
/// '.' in the mantissa ("1.0e-07", "32768.0") so YAML 1.1 readers see a float.
std::string yaml_double(double v);

}  // namespace mpx::schema
